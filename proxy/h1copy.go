package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
)

// The bytes of a request the loop (h1.go) forwards and of its answer:
// the heads written anew less the hop-by-hop headers, and the bodies
// pumped through as they arrive, framed exactly as they were read
// (h1grammar.go reads the framing).

// writeRequest writes the request head, and body when it is buffered,
// to the sandbox.
func (h *h1conn) writeRequest(uc *upConn, rq *request, body []byte) error {
	w := uc.bw
	w.Write(rq.line)
	w.WriteString("\r\n")
	for lines := rq.head[len(rq.line)+2 : len(rq.head)-2]; len(lines) > 0; {
		var line []byte
		line, lines, _ = bytes.Cut(lines, []byte("\r\n"))
		name, _, _ := bytes.Cut(line, []byte(":"))
		switch headerOf(name) {
		case hConnection, hKeepAlive, hProxyConnection, hProxyAuthenticate, hProxyAuthorization,
			hTrailer, hToken, hForwarded:
			continue
		case hTE:
			if rq.teTrailers {
				w.WriteString("Te: trailers\r\n")
			}
			continue
		}
		w.Write(line)
		w.WriteString("\r\n")
	}
	if h.remote != "" {
		w.WriteString("X-Forwarded-For: ")
		w.WriteString(h.remote)
		w.WriteString("\r\n")
	}
	w.WriteString("X-Forwarded-Host: ")
	w.Write(rq.host)
	w.WriteString("\r\nX-Forwarded-Proto: http\r\n\r\n")
	w.Write(body)
	return w.Flush()
}

// copyResponse reads the sandbox's answer and sends it to the client. It
// tells whether the upstream and the client connections can serve
// another request, and whether the client got anything of the answer.
func (h *h1conn) copyResponse(uc *upConn, rq *request) (upKeep, clientKeep, headSent bool, err error) {
	for {
		head, err := readHeadLines(h.scratch[:0], uc.br)
		h.scratch = head[:0]
		if err != nil {
			return false, false, headSent, err
		}
		rs, err := parseResponse(head)
		if err == nil && rs.status == 101 {
			err = errors.New("an upgrade nobody asked for")
		}
		if err != nil {
			return false, false, headSent, err
		}
		noBody := rq.isHead || rs.status < 200 || rs.status == 204 || rs.status == 304
		untilClose := !noBody && !rs.chunked && rs.contentLength < 0
		h.writeResponseHead(head, &rs, untilClose)
		headSent = true
		switch {
		case rs.status < 200:
			// 1xx (103 Early Hints): pass it on; the final answer follows.
			if err := h.bw.Flush(); err != nil {
				return false, false, true, err
			}
			continue
		case noBody:
		case rs.chunked:
			err = pumpChunked(h.bw, uc.br)
		case rs.contentLength >= 0:
			err = pump(h.bw, uc.br, rs.contentLength)
		default:
			err = pump(h.bw, uc.br, -1)
		}
		if err == nil {
			err = h.bw.Flush()
		}
		return err == nil && !rs.close && !untilClose, !untilClose, true, err
	}
}

// writeResponseHead writes the response head to the client, less the
// hop-by-hop headers; "Connection: close" when the body ends with the
// connection.
func (h *h1conn) writeResponseHead(head []byte, rs *response, untilClose bool) {
	w := h.bw
	line, lines, _ := bytes.Cut(head, []byte("\n"))
	w.WriteString("HTTP/1.1")
	w.Write(bytes.TrimRight(line[len("HTTP/1.x"):], "\r"))
	w.WriteString("\r\n")
	for line := range headerLines(lines) {
		name, _, _ := bytes.Cut(line, []byte(":"))
		switch headerOf(name) {
		case hConnection, hKeepAlive, hProxyConnection, hUpgrade, hTE:
			continue
		case hContentLength:
			if rs.hasTE {
				continue
			}
		}
		if named(rs.connTokens, name) {
			continue
		}
		w.Write(line)
		w.WriteString("\r\n")
	}
	if untilClose {
		w.WriteString("Connection: close\r\n")
	}
	w.WriteString("\r\n")
}

func named(tokens [][]byte, name []byte) bool {
	for _, t := range tokens {
		if bytes.EqualFold(t, name) {
			return true
		}
	}
	return false
}

// readHeadLines appends a response head, up to and with its blank line,
// to dst.
func readHeadLines(dst []byte, r *bufio.Reader) ([]byte, error) {
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return dst, err
		}
		dst = append(dst, line...)
		if len(dst) > maxRespHead {
			return dst, errors.New("response head too large")
		}
		if len(line) == 1 || (len(line) == 2 && line[0] == '\r') {
			return dst, nil
		}
	}
}

// pump copies n bytes (n < 0: up to the end of src) from src to dst,
// flushing dst whenever src has nothing more buffered, so what a slow
// sender wrote arrives before the next piece.
func pump(dst *bufio.Writer, src *bufio.Reader, n int64) error {
	for n != 0 {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return err
			}
			if _, err := src.Peek(1); err != nil {
				if n < 0 && errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
		k := src.Buffered()
		if n > 0 && int64(k) > n {
			k = int(n)
		}
		b, _ := src.Peek(k)
		if _, err := dst.Write(b); err != nil {
			return err
		}
		src.Discard(k)
		if n > 0 {
			n -= int64(k)
		}
	}
	return nil
}

// pumpChunked copies a chunked body, writing its framing anew: each
// chunk's size in hex and CRLF (extensions dropped), its data, CRLF, and
// the trailers after the last, each checked as a header line. What the
// client reads is therefore framed exactly as the proxy read it.
func pumpChunked(dst *bufio.Writer, src *bufio.Reader) error {
	line := func() ([]byte, error) {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return nil, err
			}
		}
		l, err := src.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(bytes.TrimSuffix(l, []byte("\n")), []byte("\r")), nil
	}
	for {
		l, err := line()
		if err != nil {
			return err
		}
		size, ok := chunkSize(l)
		if !ok {
			return errors.New("malformed chunk size")
		}
		dst.WriteString(strconv.FormatInt(size, 16))
		dst.WriteString("\r\n")
		if size == 0 {
			for { // trailers, up to a blank line
				l, err := line()
				if err != nil {
					return err
				}
				if len(l) == 0 {
					_, err = dst.WriteString("\r\n")
					return err
				}
				name, value, ok := bytes.Cut(l, []byte(":"))
				if !ok || !isToken(name) || !validValue(value) {
					return errors.New("malformed trailer")
				}
				dst.Write(l)
				dst.WriteString("\r\n")
			}
		}
		if err := pump(dst, src, size); err != nil {
			return err
		}
		if end, err := src.Peek(2); err != nil || string(end) != "\r\n" {
			return errors.New("malformed chunk end") // net/http's reader wants CRLF too
		}
		src.Discard(2)
		dst.WriteString("\r\n")
	}
}
