package client

import (
	"bufio"
	"io"
	"strings"
)

// readEvents reads a server-sent event stream and calls fn with each
// event's name and data until fn says stop, fn fails, or the stream ends.
// It returns fn's error, or the stream's.
func readEvents(r io.Reader, fn func(event string, data []byte) (stop bool, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	event := "message"
	for sc.Scan() {
		line := sc.Text()
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue // ids, comments and the blank line between events
		}
		stop, err := fn(event, []byte(data))
		if err != nil || stop {
			return err
		}
	}
	return sc.Err()
}
