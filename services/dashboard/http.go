package dashboard

import (
	"crypto/subtle"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// routes:
//
//	GET  /, /nodes, /membership, /audit   the pages (/nodes?filter=<CEL>)
//	GET  /events?page=<page>[&filter=]    the page's live part, as server-sent events
//	GET  /static/                         the script and the style sheet
//	GET  /api/timeline, /api/tolerance, /api/membership   the history views as JSON (api.go)
//	POST /api/approve, /api/roles, /api/delete   admin actions (actions.go)
//
// Every request must name the dashboard's own address as Host; every POST
// must carry the page token (csrf).
func (d *Dashboard) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(web, "web/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	for path, page := range map[string]string{"/{$}": "cluster", "/nodes": "nodes", "/membership": "membership", "/audit": "audit"} {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { d.servePage(w, r, page) })
	}
	mux.HandleFunc("GET /events", d.serveEvents)
	mux.HandleFunc("GET /api/timeline", d.serveTimeline)
	mux.HandleFunc("GET /api/tolerance", d.serveTolerance)
	mux.HandleFunc("GET /api/membership", d.serveMembership)
	mux.HandleFunc("POST /api/approve", d.action(d.approve))
	mux.HandleFunc("POST /api/roles", d.action(d.roles))
	mux.HandleFunc("POST /api/delete", d.action(d.deleteNode))
	return d.guard(mux)
}

// guard refuses a request whose Host is not the dashboard's own address
// (a page of another site whose name resolves to 127.0.0.1 reads nothing)
// and frames nothing.
func (d *Dashboard) guard(next http.Handler) http.Handler {
	_, port, _ := net.SplitHostPort(d.ln.Addr().String())
	allowed := map[string]bool{d.ln.Addr().String(): true, "localhost:" + port: true, "127.0.0.1:" + port: true, "[::1]:" + port: true}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed[r.Host] {
			http.Error(w, fmt.Sprintf("host %q is not this dashboard's address", r.Host), http.StatusForbidden)
			return
		}
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		w.Header().Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

func (d *Dashboard) servePage(w http.ResponseWriter, r *http.Request, page string) {
	filter := r.URL.Query().Get("filter")
	st, _ := d.view.snapshot()
	data := pageData{Page: page, Title: pageTitles[page], CSRF: d.csrf, Filter: filter, Live: d.pages.live(r.Context(), page, filter, st)}
	html, err := d.pages.render("page", data)
	if err != nil {
		d.log.Error("render page", "page", page, "err", err)
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(html))
}

// serveEvents streams a page's live part: at once, then after every change
// of the view that changes it (at most every 100 ms).
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	page := r.URL.Query().Get("page")
	if _, ok := pageTitles[page]; !ok {
		http.Error(w, "unknown page", http.StatusNotFound)
		return
	}
	filter := r.URL.Query().Get("filter")
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no streaming", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ctx := r.Context()
	var last string
	keepAlive := time.NewTicker(15 * time.Second)
	defer keepAlive.Stop()
	for {
		st, changed := d.view.snapshot()
		html, err := d.pages.render("live-"+page, d.pages.live(ctx, page, filter, st))
		if err != nil {
			d.log.Error("render live part", "page", page, "err", err)
			return
		}
		if html != last {
			last = html
			var b strings.Builder
			b.WriteString("event: live\n")
			for line := range strings.SplitSeq(html, "\n") {
				b.WriteString("data: " + line + "\n")
			}
			b.WriteString("\n")
			if _, err := w.Write([]byte(b.String())); err != nil {
				return
			}
			flusher.Flush()
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return
			case <-keepAlive.C:
				if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
					return
				}
				flusher.Flush()
			case <-changed:
				waiting = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// action wraps an admin action: the page token is required; the answer is
// text, "ok: ..." or the API's refusal as it said it (code and message),
// with a 4xx/5xx status.
func (d *Dashboard) action(do func(r *http.Request) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		token := r.Header.Get("X-Curia-Token")
		if token == "" {
			token = r.PostFormValue("csrf")
		}
		if subtle.ConstantTimeCompare([]byte(token), []byte(d.csrf)) != 1 {
			http.Error(w, "refused: no valid page token: reload the page and try again", http.StatusForbidden)
			return
		}
		msg, err := do(r)
		if err != nil {
			code := http.StatusBadRequest
			if _, ok := status.FromError(err); ok {
				code = http.StatusConflict
			}
			d.log.Info("admin action refused", "path", r.URL.Path, "err", err)
			w.WriteHeader(code)
			_, _ = w.Write([]byte(errText(err)))
			return
		}
		d.log.Info("admin action", "path", r.URL.Path, "result", msg)
		_, _ = w.Write([]byte(msg))
	}
}

func (d *Dashboard) approve(r *http.Request) (string, error) {
	id := r.PostFormValue("node_id")
	if _, err := d.view.mgmt.ApproveNode(r.Context(), &curatorv1.ApproveNodeRequest{NodeId: id}); err != nil {
		return "", err
	}
	return "approved " + id, nil
}

func (d *Dashboard) roles(r *http.Request) (string, error) {
	id := r.PostFormValue("node_id")
	var give bool
	switch r.PostFormValue("consensus_member") {
	case "true":
		give = true
	case "false":
	default:
		return "", fmt.Errorf("consensus_member must be true or false")
	}
	reason := r.PostFormValue("reason")
	if reason == "" {
		reason = "from the dashboard"
	}
	resp, err := d.view.mgmt.UpdateNodeRoles(r.Context(), &curatorv1.UpdateNodeRolesRequest{NodeId: id, ConsensusMember: &give, Reason: reason})
	if err != nil {
		return "", err
	}
	if give {
		return fmt.Sprintf("%s has ConsensusMember: it joins etcd as a learner; the reconciler promotes it once it caught up", resp.Node.GetId()), nil
	}
	return fmt.Sprintf("%s no longer has ConsensusMember: its etcd member is removed", resp.Node.GetId()), nil
}

func (d *Dashboard) deleteNode(r *http.Request) (string, error) {
	id := r.PostFormValue("node_id")
	if r.PostFormValue("confirm") != id {
		return "", fmt.Errorf("not confirmed: tick the confirmation of deleting %s", id)
	}
	resp, err := d.view.mgmt.DeleteNode(r.Context(), &curatorv1.DeleteNodeRequest{
		NodeId:                        id,
		SafetyBypassHasRoles:          r.PostFormValue("bypass_has_roles") == "on",
		SafetyBypassNotDecommissioned: r.PostFormValue("bypass_not_decommissioned") == "on",
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("deleted %s; revoked certificates %s", id, strings.Join(resp.RevokedSerials, ", ")), nil
}
