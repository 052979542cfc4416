package api

import (
	"context"
	"errors"
	"net/http"
)

// statusClientClosedRequest is the status recorded for a request whose
// client went away before it was answered (nginx's 499): nobody reads
// it, and it is neither an error of the server nor one of the request.
const statusClientClosedRequest = 499

// clientGone reports whether err is the end of r's context because its
// client went away (closed the connection, or gave up at its own
// deadline), rather than a failure of the server.
func clientGone(r *http.Request, err error) bool {
	return r.Context().Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}
