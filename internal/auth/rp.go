package auth

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/db"
)

// Login failures, each with its HTTP status in the web layer.
var (
	ErrBadState    = errors.New("auth: missing, unknown, expired or replayed login state") // 400
	ErrLoginFailed = errors.New("auth: the provider's answer did not verify")              // 401
	ErrNoRole      = errors.New("auth: no console role for this identity")                 // 403
	// ErrTooManyLogins: the cap on pending logins is reached (429, no row).
	ErrTooManyLogins = errors.New("auth: too many sign-ins in progress")
)

// maxFutureSkew is how far in the future an ID token's iat may lie (the
// provider's clock runs a little ahead); further is a forged or replayed
// token from a broken clock.
const maxFutureSkew = time.Minute

// RPConfig configures the relying party.
type RPConfig struct {
	Issuer       string
	ClientID     string
	ClientSecret string
	RedirectURL  string // <CONSOLE_PUBLIC_URL>/auth/callback
	PostLogout   string // where the provider sends the browser after logout
	RolesClaim   string // OIDC_ROLES_CLAIM, default "groups"
	RoleMap      RoleMap
	// Scopes, when set (OIDC_SCOPES), are requested as given. Empty: openid,
	// plus profile, email, groups and offline_access when the provider's
	// discovery lists them in scopes_supported (profile and email when it
	// lists nothing): a scope the provider does not know is never asked for.
	Scopes   []string
	LoginTTL time.Duration // how long a started login may take (default 10m)
	// MaxPendingLogins caps the unexpired console_login rows (default
	// 10000): anonymous GET /login cannot fill the table.
	MaxPendingLogins int
	HTTPClient       *http.Client     // talks to the provider (nil: http.DefaultClient)
	Now              func() time.Time // the verifier's and the state's clock (tests inject it)
}

// RP is the OIDC relying party: authorization code flow with PKCE (S256),
// one-time state bound to the browser, nonce checked here, ID token verified
// by go-oidc (issuer, audience, expiry, signature).
type RP struct {
	cfg        RPConfig
	pool       *pgxpool.Pool
	sessions   *Sessions
	provider   *oidc.Provider
	verifier   *oidc.IDTokenVerifier
	oauth      oauth2.Config
	endSession string
	clientCtx  context.Context // carries the HTTP client for token and key requests
}

// Defaults of RPConfig, applied to zero fields; `console serve` shows the
// ones it has flags for (OIDC_ROLES_CLAIM, CONSOLE_LOGIN_PENDING_MAX).
const (
	DefaultRolesClaim       = "groups"
	DefaultLoginTTL         = 10 * time.Minute
	DefaultMaxPendingLogins = 10000
)

// NewRP discovers the provider (issuer must match its discovery document).
func NewRP(ctx context.Context, cfg RPConfig, pool *pgxpool.Pool, sessions *Sessions) (*RP, error) {
	if cfg.RolesClaim == "" {
		cfg.RolesClaim = DefaultRolesClaim
	}
	if cfg.LoginTTL <= 0 {
		cfg.LoginTTL = DefaultLoginTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxPendingLogins <= 0 {
		cfg.MaxPendingLogins = DefaultMaxPendingLogins
	}
	if len(cfg.RoleMap) == 0 {
		return nil, errors.New("auth: empty role map")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 15 * time.Second}
	}
	// Keys are fetched lazily for the lifetime of the RP, not of this call.
	clientCtx := oidc.ClientContext(context.WithoutCancel(ctx), hc)
	dctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, hc), 15*time.Second)
	defer cancel()
	provider, err := oidc.NewProvider(dctx, cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("OIDC_ISSUER: discovery: %w", err)
	}
	var extra struct {
		EndSession      string   `json:"end_session_endpoint"`
		ScopesSupported []string `json:"scopes_supported"`
	}
	if err := provider.Claims(&extra); err != nil {
		return nil, fmt.Errorf("OIDC_ISSUER: discovery document: %w", err)
	}
	rp := &RP{
		cfg:        cfg,
		pool:       pool,
		sessions:   sessions,
		provider:   provider,
		endSession: extra.EndSession,
		clientCtx:  clientCtx,
		verifier:   provider.VerifierContext(clientCtx, &oidc.Config{ClientID: cfg.ClientID, Now: cfg.Now}),
		oauth: oauth2.Config{
			ClientID:     cfg.ClientID,
			ClientSecret: cfg.ClientSecret,
			Endpoint:     provider.Endpoint(),
			RedirectURL:  cfg.RedirectURL,
			Scopes:       ChooseScopes(cfg.Scopes, extra.ScopesSupported),
		},
	}
	return rp, nil
}

// ChooseScopes is the scope list of the authorization request: configured
// as given, else openid plus the optional scopes the provider lists.
// Dex, Keycloak and Authelia release the groups claim only for the groups
// scope; Entra ID refuses a scope it does not know, so none is guessed.
// offline_access brings the refresh token the role re-check presents.
func ChooseScopes(configured, supported []string) []string {
	if len(configured) > 0 {
		return slices.Clone(configured)
	}
	if supported == nil {
		return []string{oidc.ScopeOpenID, "profile", "email"}
	}
	out := []string{oidc.ScopeOpenID}
	for _, s := range []string{"profile", "email", "groups", oidc.ScopeOfflineAccess} {
		if slices.Contains(supported, s) {
			out = append(out, s)
		}
	}
	return out
}

// Scopes are the scopes this RP asks for.
func (rp *RP) Scopes() []string { return slices.Clone(rp.oauth.Scopes) }

// Begin starts a login: it stores a one-time state (hashed) with the nonce,
// the PKCE verifier and the post-login path, bound to a fresh browser
// cookie value, and returns the provider URL and that cookie value. With
// reauth the provider is asked to authenticate the user again (prompt=login,
// max_age=0), for actions that need a recent login.
func (rp *RP) Begin(ctx context.Context, next string, reauth bool) (authURL, binding string, err error) {
	state, err := randomToken()
	if err != nil {
		return "", "", err
	}
	nonce, err := randomToken()
	if err != nil {
		return "", "", err
	}
	if binding, err = randomToken(); err != nil {
		return "", "", err
	}
	verifier := oauth2.GenerateVerifier()
	// The cap is checked in the insert itself. Concurrent logins may pass it
	// by a few rows (each counts before the others commit): it bounds the
	// table, it is not an exact quota.
	now := rp.cfg.Now()
	tag, err := rp.pool.Exec(ctx, `
		INSERT INTO console_login (state_hash, binding_hash, nonce, pkce_verifier, next_path, created_at, expires_at)
		SELECT $1, $2, $3, $4, $5, $6, $7
		WHERE (SELECT count(*) FROM (SELECT 1 FROM console_login WHERE expires_at > $6 LIMIT $8) pending) < $8`,
		HashToken(state), HashToken(binding), nonce, verifier, SafeNext(next), now, now.Add(rp.cfg.LoginTTL), rp.cfg.MaxPendingLogins)
	if err != nil {
		return "", "", fmt.Errorf("auth: store login state: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", "", ErrTooManyLogins
	}
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier), oidc.Nonce(nonce)}
	if reauth {
		opts = append(opts, oauth2.SetAuthURLParam("prompt", "login"), oauth2.SetAuthURLParam("max_age", "0"))
	}
	u := rp.oauth.AuthCodeURL(state, opts...)
	return u, binding, nil
}

// RequestMeta is who sent a request, for the audit trail.
type RequestMeta struct {
	IP        string
	UserAgent string
	RequestID string
	// Path is the request's path (no query: searches carry customers'
	// data there), cut to maxMetaPath bytes: a refusal's audit row names
	// the object (/approvals/12/approve), where its route template
	// (/approvals/:id/approve) names only the kind.
	Path string
}

// MaxMetaPath bounds RequestMeta.Path.
const MaxMetaPath = 256

// Callback is what the provider sent back, plus the browser's cookies.
type Callback struct {
	State      string
	Code       string
	Error      string // the provider's error parameter, if any
	Binding    string // the login cookie
	OldSession string // the session cookie held before login, if any: ended
	Meta       RequestMeta
}

// Login is a completed login.
type Login struct {
	Token   string // the new session cookie value
	Session *Session
	Next    string
}

// Finish completes a login. Errors wrap ErrBadState, ErrLoginFailed or
// ErrNoRole; in every error case no session exists afterwards, and the
// failed attempt is audited (action auth.login, outcome denied, the reason
// in error_code).
func (rp *RP) Finish(ctx context.Context, cb Callback) (*Login, error) {
	l, idt, code, err := rp.finish(ctx, cb)
	if err == nil || code == "" {
		return l, err
	}
	ev := audit.Event{
		Action: "auth.login", TargetType: "session", Outcome: audit.OutcomeDenied, ErrorCode: code,
		IP: cb.Meta.IP, UserAgent: cb.Meta.UserAgent, RequestID: cb.Meta.RequestID,
	}
	if idt != nil { // the token verified: the attempt has an identity
		ev.ActorIss, ev.ActorSub = idt.Issuer, idt.Subject
	}
	// The browser may have gone: the attempt still leaves its trace.
	actx := context.WithoutCancel(ctx)
	if aerr := db.WithTx(actx, rp.pool, func(tx pgx.Tx) error { return audit.Record(actx, tx, ev) }); aerr != nil {
		return nil, errors.Join(err, fmt.Errorf("auth: audit failed login: %w", aerr))
	}
	return nil, err
}

// finish does Finish's work. A failure comes with its audit code (empty
// when the failure is already audited or is not a sign-in failure) and,
// when the token verified, the token.
func (rp *RP) finish(ctx context.Context, cb Callback) (*Login, *oidc.IDToken, string, error) {
	if cb.State == "" || cb.Binding == "" {
		return nil, nil, "bad_state", ErrBadState
	}
	// Consume the state first: whatever happens next, it cannot be replayed.
	var (
		bindingHash     []byte
		nonce, verifier string
		next            string
		expires         time.Time
	)
	err := rp.pool.QueryRow(ctx, `
		DELETE FROM console_login WHERE state_hash = $1
		RETURNING binding_hash, nonce, pkce_verifier, next_path, expires_at`,
		HashToken(cb.State)).Scan(&bindingHash, &nonce, &verifier, &next, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, "bad_state", ErrBadState
	}
	if err != nil {
		return nil, nil, "", fmt.Errorf("auth: read login state: %w", err)
	}
	if subtle.ConstantTimeCompare(bindingHash, HashToken(cb.Binding)) != 1 {
		return nil, nil, "bad_state", ErrBadState
	}
	if !rp.cfg.Now().Before(expires) {
		return nil, nil, "state_expired", ErrBadState
	}
	if cb.Error != "" || cb.Code == "" {
		return nil, nil, "provider_error", fmt.Errorf("%w: provider returned no code", ErrLoginFailed)
	}
	ectx, cancel := context.WithTimeout(rp.clientCtx, 15*time.Second)
	defer cancel()
	tok, err := rp.oauth.Exchange(ectx, cb.Code, oauth2.VerifierOption(verifier))
	if err != nil {
		return nil, nil, "code_exchange", fmt.Errorf("%w: code exchange: %v", ErrLoginFailed, err)
	}
	rawID, _ := tok.Extra("id_token").(string)
	if rawID == "" {
		return nil, nil, "no_id_token", fmt.Errorf("%w: no id_token", ErrLoginFailed)
	}
	idt, code, err := rp.verify(ctx, rawID)
	if err != nil {
		return nil, nil, code, err
	}
	// go-oidc does not check the nonce: that is the app's job.
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 {
		return nil, idt, "nonce_mismatch", fmt.Errorf("%w: nonce mismatch", ErrLoginFailed)
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return nil, idt, "claims", fmt.Errorf("%w: claims: %v", ErrLoginFailed, err)
	}
	name, _ := claims["preferred_username"].(string)
	if name == "" {
		name, _ = claims["name"].(string)
	}
	groups := groupsFromClaim(claims[rp.cfg.RolesClaim])
	roles := rp.cfg.RoleMap.Roles(groups)
	ev := audit.Event{
		ActorIss: idt.Issuer, ActorSub: idt.Subject, ActorName: name, ActorRoles: roleStrings(roles),
		Action: "auth.login", TargetType: "session",
		IP: cb.Meta.IP, UserAgent: cb.Meta.UserAgent, RequestID: cb.Meta.RequestID,
	}
	if len(roles) == 0 {
		ev.Outcome, ev.ErrorCode = audit.OutcomeDenied, "no_mapped_role"
		ev.After, _ = json.Marshal(map[string]any{"groups": groups})
		if err := db.WithTx(ctx, rp.pool, func(tx pgx.Tx) error { return audit.Record(ctx, tx, ev) }); err != nil {
			return nil, nil, "", err
		}
		return nil, nil, "", ErrNoRole
	}
	// auth_time is when the user really authenticated. Without it the time
	// is unknown and counts as long ago: iat would be wrong, since a silent
	// single sign-on mints a fresh token for an old authentication, and
	// money-moving actions must not take that for a recent login. (A
	// re-authentication sends max_age, which obliges the provider to send
	// auth_time.)
	var authTime time.Time
	if at, ok := claims["auth_time"].(float64); ok && at > 0 {
		authTime = time.Unix(int64(at), 0)
	}
	sess := &Session{Issuer: idt.Issuer, Subject: idt.Subject, Name: name, Roles: roles, AuthTime: authTime,
		IDTokenHint: rawID, refreshToken: tok.RefreshToken}
	var token string
	err = db.WithTx(ctx, rp.pool, func(tx pgx.Tx) error {
		if cb.OldSession != "" {
			if err := rp.sessions.deleteByHash(ctx, tx, HashToken(cb.OldSession)); err != nil {
				return err
			}
		}
		var err error
		if token, err = rp.sessions.create(ctx, tx, sess); err != nil {
			return err
		}
		ev.SessionHash, ev.Outcome = sess.HashHex(), audit.OutcomeOK
		return audit.Record(ctx, tx, ev)
	})
	if err != nil {
		return nil, nil, "", err
	}
	return &Login{Token: token, Session: sess, Next: SafeNext(next)}, nil, "", nil
}

// verify checks an ID token: go-oidc's verifier (signature, issuer,
// audience, expiry on the injected clock), then what it leaves to the app:
// with several audiences azp must name this client (and whenever azp is
// present it must be this client), and iat may not lie in the future
// beyond a small skew. A failure comes with its audit code.
func (rp *RP) verify(ctx context.Context, raw string) (*oidc.IDToken, string, error) {
	idt, err := rp.verifier.Verify(ctx, raw)
	if err != nil {
		code := "token_invalid"
		var expired *oidc.TokenExpiredError
		if errors.As(err, &expired) {
			code = "token_expired"
		}
		return nil, code, fmt.Errorf("%w: %v", ErrLoginFailed, err)
	}
	var extra struct {
		AZP string `json:"azp"`
	}
	if err := idt.Claims(&extra); err != nil {
		return nil, "claims", fmt.Errorf("%w: claims: %v", ErrLoginFailed, err)
	}
	if len(idt.Audience) > 1 && extra.AZP == "" || extra.AZP != "" && extra.AZP != rp.cfg.ClientID {
		return nil, "azp_mismatch", fmt.Errorf("%w: token for several audiences without this client as azp", ErrLoginFailed)
	}
	if idt.IssuedAt.After(rp.cfg.Now().Add(maxFutureSkew)) {
		return nil, "issued_in_future", fmt.Errorf("%w: token issued in the future (%s)", ErrLoginFailed, idt.IssuedAt.UTC().Format(time.RFC3339))
	}
	return idt, "", nil
}

// Logout ends sess (with its audit event) and returns where to send the
// browser: the provider's end_session_endpoint when it has one.
func (rp *RP) Logout(ctx context.Context, sess *Session, meta RequestMeta) (string, error) {
	err := db.WithTx(ctx, rp.pool, func(tx pgx.Tx) error {
		if err := rp.sessions.deleteByHash(ctx, tx, sess.IDHash); err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.Event{
			ActorIss: sess.Issuer, ActorSub: sess.Subject, ActorName: sess.Name, ActorRoles: sess.RoleNames(),
			Action: "auth.logout", TargetType: "session", SessionHash: sess.HashHex(),
			IP: meta.IP, UserAgent: meta.UserAgent, RequestID: meta.RequestID, Outcome: audit.OutcomeOK,
		})
	})
	if err != nil {
		return "", err
	}
	return rp.SignOutURL(sess.IDTokenHint), nil
}

// SignOutURL is where a sign-out sends the browser: the provider's
// end_session_endpoint when it has one (with the ID token hint when the
// session still had one), else the console's signed-out page. A sign-out
// whose session had already ended uses it too, so the provider's session
// ends as well.
func (rp *RP) SignOutURL(idTokenHint string) string {
	if rp.endSession == "" {
		return rp.cfg.PostLogout
	}
	u, err := url.Parse(rp.endSession)
	if err != nil {
		return rp.cfg.PostLogout
	}
	q := u.Query()
	q.Set("client_id", rp.cfg.ClientID)
	if idTokenHint != "" {
		q.Set("id_token_hint", idTokenHint)
	}
	if rp.cfg.PostLogout != "" {
		q.Set("post_logout_redirect_uri", rp.cfg.PostLogout)
	}
	u.RawQuery = q.Encode()
	return u.String()
}
