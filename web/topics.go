package web

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/internal/auth"
	"github.com/sluice-dev/sluice/internal/outbox"
	"github.com/sluice-dev/sluice/views"
)

// topicForm is POST /outbox/topics/{topic}/pause|resume, parsed.
type topicForm struct {
	topic       string
	reason      string
	reasonError string
}

func parseTopicForm(c echo.Context) (topicForm, error) {
	topic, err := url.PathUnescape(c.Param("topic"))
	if err != nil || outbox.ValidTopic(topic) != nil {
		return topicForm{}, badRequest("That is not a topic name (1–200 characters).")
	}
	f := topicForm{topic: topic, reason: strings.TrimSpace(c.FormValue("reason"))}
	switch {
	case f.reason == "":
		f.reasonError = "Say why: a reason is required, and it is kept in the audit trail."
	case utf8.RuneCountInString(f.reason) > maxReason:
		f.reasonError = "The reason is too long (at most 1000 characters)."
	case !utf8.ValidString(f.reason) || strings.ContainsRune(f.reason, 0):
		f.reasonError = "The reason contains characters that cannot be stored."
	}
	return f, nil
}

// handleTopic pauses (pause true) or resumes a topic: compare-and-set on
// the state the operator saw (pausing a paused topic, or resuming a running
// one, is a 409 that changes nothing), the change and its audit row in one
// transaction, every refused attempt audited (outbox.SetTopicPaused, which
// the command line uses too). Success redirects to the topic's outbox list,
// which shows the pause (or its absence).
func (a *App) handleTopic(pause bool) echo.HandlerFunc {
	action := "resume"
	if pause {
		action = "pause"
	}
	return func(c echo.Context) error {
		f, err := parseTopicForm(c)
		if err != nil {
			return err
		}
		ctx := c.Request().Context()
		sess := auth.SessionFrom(c)
		ev := a.actorEvent(c, sess, "", "", "")
		reason := f.reason
		if f.reasonError != "" {
			reason = "" // refused as invalid, and audited so
		}
		_, err = outbox.SetTopicPaused(ctx, a.pool, f.topic, pause, reason, ev)
		list := url.Values{"topic": {f.topic}}
		var conflict *outbox.TopicConflictError
		switch {
		case err == nil:
			a.metrics.actions.WithLabelValues("outbox.topic."+action, "ok").Inc()
			a.pokeLive(ctx)
			return c.Redirect(http.StatusSeeOther, "/outbox?"+list.Encode())
		case errors.As(err, &conflict):
			a.metrics.actions.WithLabelValues("outbox.topic."+action, "conflict").Inc()
			msg := "Topic " + f.topic + " is not paused: there is nothing to resume. Nothing was changed."
			if conflict.Paused != nil {
				msg = "Topic " + f.topic + " is already " + views.PausedBy(*conflict.Paused, a.now()) + ". Nothing was changed."
			}
			return a.renderOutboxList(c, list, http.StatusConflict, func(d *views.TopicControlsData) { d.Problem = msg })
		case errors.Is(err, outbox.ErrInvalidAction):
			a.metrics.actions.WithLabelValues("outbox.topic."+action, "invalid").Inc()
			msg := f.reasonError
			if msg == "" {
				msg = "Say why: a reason is required, and it is kept in the audit trail."
			}
			return a.renderOutboxList(c, list, http.StatusUnprocessableEntity, func(d *views.TopicControlsData) {
				d.Problem, d.ReasonError, d.Action, d.Reason = "Nothing was changed: "+msg, msg, action, f.reason
			})
		default:
			a.metrics.actions.WithLabelValues("outbox.topic."+action, "error").Inc()
			return err
		}
	}
}
