package auth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/auth"
)

// The provider's tokens a session keeps (the refresh token the role
// re-check presents, the ID token sent as the sign-out hint) are in
// console_session only sealed: a reader of the table gets neither, a
// request with the cookie gets both, and a re-check stores the rotated
// refresh token sealed too.
func TestSessionTokensAreSealedAtRest(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	const first, rotated = "rt-CANARY-first-7f3a", "rt-CANARY-rotated-91c2"
	f.idp.refresh, f.idp.next = first, rotated
	l, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	stored := func() (hint, refresh string) {
		t.Helper()
		if err := f.pool.QueryRow(context.Background(), `SELECT id_token_hint, refresh_token FROM console_session WHERE id_hash = $1`,
			l.Session.IDHash).Scan(&hint, &refresh); err != nil {
			t.Fatal(err)
		}
		return hint, refresh
	}
	hint, refresh := stored()
	idToken := l.Session.IDTokenHint
	if !strings.HasPrefix(idToken, "eyJ") {
		t.Fatalf("the login's session holds no ID token to hint with: %q", idToken)
	}
	for _, v := range []string{hint, refresh} {
		// Not a bare "eyJ": base64 of sealed bytes holds it by chance about
		// once in two hundred values (a CI run met one); the ID token's
		// first 20 characters, or the canary, cannot appear by chance.
		if !strings.HasPrefix(v, "s1.") || strings.Contains(v, "CANARY") || strings.Contains(v, idToken[:20]) {
			t.Fatalf("a token is stored in clear or unsealed: %q", v)
		}
	}
	sess, err := f.sessions.Touch(context.Background(), l.Token)
	if err != nil || sess.IDTokenHint != idToken {
		t.Fatalf("the cookie's request does not open the hint: %v (hint %d bytes, want %d)", err, len(sess.IDTokenHint), len(idToken))
	}

	// The re-check presents the first refresh token (the provider refuses
	// any other) and keeps the rotated one, sealed.
	rc := &auth.RoleCheck{RP: f.rp, Every: time.Minute, Now: func() time.Time { return time.Now().Add(time.Hour) }}
	if _, err := rc.Check(context.Background(), sess, auth.RequestMeta{}); err != nil {
		t.Fatalf("re-check with the sealed refresh token: %v", err)
	}
	if f.idp.grants() != 1 {
		t.Fatalf("the provider answered %d refresh grants, want 1", f.idp.grants())
	}
	_, again := stored()
	if again == refresh || !strings.HasPrefix(again, "s1.") || strings.Contains(again, "CANARY") {
		t.Fatalf("the rotated refresh token is not stored sealed: %q (was %q)", again, refresh)
	}
	f.idp.mu.Lock()
	f.idp.next = "rt-CANARY-third"
	f.idp.mu.Unlock()
	sess, err = f.sessions.Touch(context.Background(), l.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&auth.RoleCheck{RP: f.rp, Every: time.Minute, Now: func() time.Time { return time.Now().Add(3 * time.Hour) }}).Check(context.Background(), sess, auth.RequestMeta{}); err != nil || f.idp.grants() != 2 {
		t.Fatalf("the second re-check must present the rotated token: %v, %d grants", err, f.idp.grants())
	}
}

// A sealed token opens only in its own row and column: moved to another
// session, swapped between columns or altered, the row is no session
// (a writer of the table cannot graft one session's tokens onto another).
func TestSessionTokensMovedOrAlteredEndTheSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.idp.refresh = "rt-1"
	a, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	f.idp.refresh = "rt-2"
	b, err := f.login(t, "/", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, sql := range map[string]string{
		"another session's refresh token": `UPDATE console_session SET refresh_token = (SELECT refresh_token FROM console_session WHERE id_hash = $2) WHERE id_hash = $1`,
		"the columns swapped":             `UPDATE console_session SET refresh_token = id_token_hint, id_token_hint = refresh_token WHERE id_hash = $1 AND $2::bytea IS NOT NULL`,
		"one character altered":           `UPDATE console_session SET id_token_hint = overlay(id_token_hint placing (CASE WHEN substr(id_token_hint, 10, 1) = 'A' THEN 'B' ELSE 'A' END) from 10 for 1) WHERE id_hash = $1 AND $2::bytea IS NOT NULL`,
		"written in clear":                `UPDATE console_session SET refresh_token = 'rt-1' WHERE id_hash = $1 AND $2::bytea IS NOT NULL`,
	} {
		t.Run(name, func(t *testing.T) {
			// Each case starts from a's own row, as the login wrote it.
			var hint, refresh string
			if err := f.pool.QueryRow(ctx, `SELECT id_token_hint, refresh_token FROM console_session WHERE id_hash = $1`, a.Session.IDHash).Scan(&hint, &refresh); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := f.pool.Exec(ctx, `UPDATE console_session SET id_token_hint = $2, refresh_token = $3 WHERE id_hash = $1`, a.Session.IDHash, hint, refresh); err != nil {
					t.Fatal(err)
				}
				if _, err := f.sessions.Touch(ctx, a.Token); err != nil {
					t.Fatalf("restored, the session is back: %v", err)
				}
			}()
			if tag, err := f.pool.Exec(ctx, sql, a.Session.IDHash, b.Session.IDHash); err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("tamper: %v %v", tag, err)
			}
			if _, err := f.sessions.Touch(ctx, a.Token); !errors.Is(err, auth.ErrNoSession) {
				t.Fatalf("Touch: %v, want ErrNoSession", err)
			}
			if _, err := f.sessions.Peek(ctx, a.Token); !errors.Is(err, auth.ErrNoSession) {
				t.Fatalf("Peek: %v, want ErrNoSession", err)
			}
			if _, err := f.sessions.Touch(ctx, b.Token); err != nil {
				t.Fatalf("the other session is untouched: %v", err)
			}
		})
	}
}
