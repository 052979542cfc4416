package envd

// processRoutes mounts the process.Process Connect service.
func (s *Server) processRoutes() {}
