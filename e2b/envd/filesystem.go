package envd

// filesystemRoutes mounts the filesystem.Filesystem Connect service.
func (s *Server) filesystemRoutes() {}
