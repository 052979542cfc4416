package api

// limit takes a request's token from its key's bucket. Admin keys are
// exempt: the operator's key must reach the daemon whatever the load,
// also to raise the quota of a tenant being throttled.
func (s *Server) limit(p principal) error {
	if p.admin {
		return nil
	}
	return s.limiter.Take(p.keyID)
}
