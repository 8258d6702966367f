package dashboard

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// The history views as JSON, for curl and scripts (the pages show the
// same):
//
//	GET /api/timeline[?limit=N][&since=1h]  the membership timeline, newest first
//	GET /api/tolerance                      the sampled consensus status, oldest first
//	GET /api/membership                     the learners' catch-up and the nodes in maintenance

// timelineJSON is GET /api/timeline's answer.
type timelineJSON struct {
	Timeline []timelineRow `json:"timeline"`
}

// toleranceJSON is GET /api/tolerance's answer.
type toleranceJSON struct {
	Period  string   `json:"period"` // a sample at most this often, and at every change
	Window  string   `json:"window"` // how far back the samples reach
	Samples []sample `json:"samples"`
}

// membershipJSON is GET /api/membership's answer.
type membershipJSON struct {
	Learners           []learnerRow     `json:"learners"`
	Maintenance        []maintenanceRow `json:"maintenance"`
	VoterInMaintenance bool             `json:"voter_in_maintenance"`
}

func (d *Dashboard) serveTimeline(w http.ResponseWriter, r *http.Request) {
	limit := d.cfg.TimelineEvents
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			http.Error(w, "limit: a positive number of rows", http.StatusBadRequest)
			return
		}
		limit = min(n, limit)
	}
	var since time.Time
	if s := r.URL.Query().Get("since"); s != "" {
		ago, err := time.ParseDuration(s)
		if err != nil || ago <= 0 {
			http.Error(w, "since: a positive duration, e.g. 1h", http.StatusBadRequest)
			return
		}
		since = time.Now().Add(-ago)
	}
	st, _ := d.view.snapshot()
	d.writeJSON(w, timelineJSON{Timeline: nonNil(timelineOf(st.Timeline, limit, since))})
}

func (d *Dashboard) serveTolerance(w http.ResponseWriter, _ *http.Request) {
	st, _ := d.view.snapshot()
	d.writeJSON(w, toleranceJSON{
		Period: d.cfg.Refresh.String(), Window: d.cfg.History.String(),
		Samples: nonNil(within(st.History, d.cfg.History, time.Now())),
	})
}

func (d *Dashboard) serveMembership(w http.ResponseWriter, _ *http.Request) {
	st, _ := d.view.snapshot()
	m := membershipJSON{
		Learners:    nonNil(learnersOf(st.Consensus, st.Timeline, st.LearnerSeen)),
		Maintenance: nonNil(maintenanceOf(st.Nodes, st.Consensus, time.Now())),
	}
	for _, r := range m.Maintenance {
		m.VoterInMaintenance = m.VoterInMaintenance || r.Voter
	}
	d.writeJSON(w, m)
}

func (d *Dashboard) writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		d.log.Debug("write json", "err", err)
	}
}

// nonNil is s, or an empty slice: JSON [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
