package envd

import (
	"net/http"

	"github.com/torpor-dev/torpor"
)

// filesRoutes mounts GET and POST /files.
func (s *Server) filesRoutes() {}

// signedTransfer tells whether r is a GET or POST /files signed with sb's
// access token (the SDK's downloadUrl/uploadUrl): ok when the signature
// is valid, an error when it is present but wrong or expired.
func (s *Server) signedTransfer(r *http.Request, sb *torpor.Sandbox) (ok bool, err error) {
	return false, nil
}
