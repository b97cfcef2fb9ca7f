package web

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// knownMethods are the methods the console answers. Any token is a valid
// HTTP method, so an unknown one is refused before anything counts it: a
// method is never a free-form metric label or audit value.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// methodLabel bounds the method for metric labels.
func methodLabel(m string) string {
	if knownMethods[m] {
		return m
	}
	return "other"
}

// onlyKnownMethods answers an unknown method with 501 before routing,
// metrics, the cross-origin check and the audit trail.
func (a *App) onlyKnownMethods(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !knownMethods[r.Method] {
			a.setSecurityHeaders(w.Header())
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusNotImplemented)
			_, _ = io.WriteString(w, "Not Implemented: unknown method\n")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bodyDeadline gives a request that carries a body ReadTimeout, from the
// start of the handler, to deliver it: a client trickling a body is cut off
// (the read fails, and the server closes the connection instead of
// draining it). The deadline is lifted when the body has been read, so a
// handler that runs longer is not cut; requests without a body (pages,
// websocket handshakes) are bounded by ReadHeaderTimeout and IdleTimeout.
func (a *App) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if err := rc.SetReadDeadline(time.Now().Add(a.cfg.ReadTimeout)); err == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
			}
		}
		next.ServeHTTP(w, r)
	})
}

type deadlineBody struct {
	io.ReadCloser
	lift func()
	once sync.Once
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.lift)
	}
	return n, err
}
