package envd

// filesRoutes mounts GET and POST /files.
func (s *Server) filesRoutes() {}
