package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/oauth2"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
)

// Re-check outcomes.
var (
	// ErrSessionEnded: the re-check found no mapped role any more (or the
	// provider no longer honours the session's refresh token): the session
	// has been deleted, audited, and its websockets told.
	ErrSessionEnded = errors.New("auth: session ended: its roles are gone at the provider")
	// ErrProviderUnavailable: the provider could not be asked. The session
	// is kept (a provider outage does not sign everyone out), but the
	// request is refused (503) until the roles have been confirmed.
	ErrProviderUnavailable = errors.New("auth: the identity provider is unavailable for the role re-check")
)

// RoleCheck re-reads a session's roles at the provider every Every (a
// refresh-token grant, then the fresh ID token verified like a login's),
// so a user whose group is removed at the provider loses the console
// within Every instead of at the end of the session's lifetime.
type RoleCheck struct {
	RP    *RP
	Every time.Duration // CONSOLE_ROLE_RECHECK
	Now   func() time.Time
	// Ended is told the id hash (hex) of each session the re-check ends:
	// the web layer closes its websockets.
	Ended func(sessionHash string)
}

func (rc *RoleCheck) now() time.Time {
	if rc.Now != nil {
		return rc.Now()
	}
	return time.Now()
}

func (rc *RoleCheck) due(s *Session) bool { return rc.now().Sub(s.RolesCheckedAt) >= rc.Every }

// Check returns sess unchanged while its roles are fresh. When they are
// older than Every it asks the provider: still mapped → the session with
// the roles the provider states now; gone → ErrSessionEnded (the session is
// deleted and audited in one transaction); provider unreachable →
// ErrProviderUnavailable.
func (rc *RoleCheck) Check(ctx context.Context, sess *Session, meta RequestMeta) (*Session, error) {
	if rc == nil || rc.RP == nil || rc.Every <= 0 || !rc.due(sess) {
		return sess, nil
	}
	var (
		out   *Session
		ended bool
	)
	actx := context.WithoutCancel(ctx) // a re-check that ends a session completes even if the browser left
	err := db.WithTx(actx, rc.RP.pool, func(tx pgx.Tx) error {
		// The row lock makes concurrent requests of one session re-check
		// once: a rotated refresh token may be presented only once.
		cur, err := scanSession(tx.QueryRow(actx, `SELECT `+sessionColumns+` FROM console_session WHERE id_hash = $1 FOR UPDATE`, sess.IDHash), sess.sealKey)
		if err != nil {
			return err
		}
		if !rc.due(cur) { // another request has just re-checked
			out = cur
			return nil
		}
		roles, refresh, code, err := rc.RP.refreshRoles(actx, cur)
		if errors.Is(err, ErrProviderUnavailable) {
			return err
		}
		ev := audit.Event{
			ActorIss: cur.Issuer, ActorSub: cur.Subject, ActorName: cur.Name, ActorRoles: cur.RoleNames(),
			Action: "auth.role_recheck", TargetType: "session", SessionHash: cur.HashHex(),
			IP: meta.IP, UserAgent: meta.UserAgent, RequestID: meta.RequestID,
		}
		if err != nil || len(roles) == 0 {
			if code == "" {
				code = "no_mapped_role"
			}
			if err := rc.RP.sessions.deleteByHash(actx, tx, cur.IDHash); err != nil {
				return err
			}
			ev.Outcome, ev.ErrorCode = audit.OutcomeDenied, code
			ended = true
			return audit.Record(actx, tx, ev)
		}
		now := rc.now()
		sealed, err := cur.seal(columnRefreshToken, refresh)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(actx, `UPDATE console_session SET roles = $2, refresh_token = $3, roles_checked_at = $4 WHERE id_hash = $1`,
			cur.IDHash, roleStrings(roles), sealed, now); err != nil {
			return fmt.Errorf("auth: store re-checked roles: %w", err)
		}
		changed := !slices.Equal(roles, cur.Roles)
		if changed {
			ev.Before, _ = json.Marshal(map[string]any{"roles": cur.RoleNames()})
			ev.After, _ = json.Marshal(map[string]any{"roles": roleStrings(roles)})
		}
		cur.Roles, cur.refreshToken, cur.RolesCheckedAt = roles, refresh, now
		out = cur
		if changed { // an unchanged re-check is routine, not an event
			ev.ActorRoles, ev.Outcome = roleStrings(roles), audit.OutcomeOK
			return audit.Record(actx, tx, ev)
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrNoSession):
		return nil, ErrNoSession
	case err != nil:
		return nil, err
	case ended:
		if rc.Ended != nil {
			rc.Ended(sess.HashHex())
		}
		return nil, ErrSessionEnded
	}
	return out, nil
}

// refreshRoles presents the session's refresh token and reads the roles
// from the fresh ID token (verified like a login's, and of the same
// person), or from the userinfo endpoint when the provider sends no ID
// token on refresh. A failure that ends the session comes with its audit
// code; an unreachable provider is ErrProviderUnavailable.
func (rp *RP) refreshRoles(ctx context.Context, sess *Session) (roles []Role, refresh, code string, err error) {
	if sess.refreshToken == "" {
		// Without a refresh token the roles cannot be confirmed: the user
		// signs in again (the provider's single sign-on makes it quick).
		return nil, "", "no_refresh_token", errors.New("auth: the session has no refresh token")
	}
	ectx, cancel := context.WithTimeout(rp.clientCtx, 15*time.Second)
	defer cancel()
	tok, err := rp.oauth.TokenSource(ectx, &oauth2.Token{RefreshToken: sess.refreshToken}).Token()
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.Response != nil && re.Response.StatusCode >= 400 && re.Response.StatusCode < 500 &&
			re.Response.StatusCode != http.StatusTooManyRequests {
			return nil, "", "refresh_refused", fmt.Errorf("auth: refresh refused: %w", err)
		}
		return nil, "", "", fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
	}
	var claims map[string]any
	if raw, _ := tok.Extra("id_token").(string); raw != "" {
		idt, code, err := rp.verify(ctx, raw)
		if err != nil {
			return nil, "", code, err
		}
		if idt.Issuer != sess.Issuer || idt.Subject != sess.Subject {
			return nil, "", "subject_mismatch", errors.New("auth: refreshed token names another person")
		}
		if err := idt.Claims(&claims); err != nil {
			return nil, "", "claims", err
		}
	} else {
		ui, err := rp.provider.UserInfo(ectx, oauth2.StaticTokenSource(tok))
		if err != nil {
			return nil, "", "", fmt.Errorf("%w: userinfo: %v", ErrProviderUnavailable, err)
		}
		if ui.Subject != sess.Subject {
			return nil, "", "subject_mismatch", errors.New("auth: userinfo names another person")
		}
		if err := ui.Claims(&claims); err != nil {
			return nil, "", "claims", err
		}
	}
	refresh = tok.RefreshToken
	if refresh == "" {
		refresh = sess.refreshToken
	}
	return rp.cfg.RoleMap.Roles(groupsFromClaim(claims[rp.cfg.RolesClaim])), refresh, "", nil
}
