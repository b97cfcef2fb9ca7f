package devoidc

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// user is a development account. Passwords are plain text on purpose: the
// provider is a local toy with well-known logins, never a real one.
type user struct {
	id       string
	username string
	password string
	groups   []string
}

type authRequest struct {
	id          string
	clientID    string
	redirectURI string
	state       string
	nonce       string
	scopes      []string
	respType    oidc.ResponseType
	respMode    oidc.ResponseMode
	challenge   *oidc.CodeChallenge
	created     time.Time
	userID      string
	done        bool
	authTime    time.Time
}

func (a *authRequest) GetID() string                         { return a.id }
func (a *authRequest) GetACR() string                        { return "" }
func (a *authRequest) GetAudience() []string                 { return []string{a.clientID} }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.challenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.respType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.respMode }
func (a *authRequest) GetScopes() []string                   { return a.scopes }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.userID }
func (a *authRequest) Done() bool                            { return a.done }
func (a *authRequest) GetAMR() []string {
	if a.done {
		return []string{"pwd"}
	}
	return nil
}

// client is the console: a confidential web client using the code flow.
type client struct {
	id             string
	secret         string
	redirectURIs   []string
	postLogoutURIs []string
}

func (c *client) GetID() string                       { return c.id }
func (c *client) RedirectURIs() []string              { return c.redirectURIs }
func (c *client) PostLogoutRedirectURIs() []string    { return c.postLogoutURIs }
func (c *client) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c *client) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodBasic }
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken}
}
func (c *client) LoginURL(id string) string            { return "/login?authRequestID=" + id }
func (c *client) AccessTokenType() op.AccessTokenType  { return op.AccessTokenTypeBearer }
func (c *client) IDTokenLifetime() time.Duration       { return time.Hour }
func (c *client) DevMode() bool                        { return true } // allows http loopback redirect URIs
func (c *client) IsScopeAllowed(s string) bool         { return s == scopeGroups }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c *client) ClockSkew() time.Duration             { return 0 }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

type accessToken struct {
	subject  string
	clientID string
	expires  time.Time
}

// scopeGroups is the scope that releases the groups claim (always, or only
// it with Config.GroupsScopeOnly).
const scopeGroups = "groups"

// refreshToken is a grant the console presents to re-read a user's groups.
// Each use rotates it: the old value stops working.
type refreshToken struct {
	id       string
	userID   string
	clientID string
	scopes   []string
	amr      []string
	authTime time.Time
	expires  time.Time
}

func (r *refreshToken) GetAMR() []string                 { return r.amr }
func (r *refreshToken) GetAudience() []string            { return []string{r.clientID} }
func (r *refreshToken) GetAuthTime() time.Time           { return r.authTime }
func (r *refreshToken) GetClientID() string              { return r.clientID }
func (r *refreshToken) GetScopes() []string              { return r.scopes }
func (r *refreshToken) GetSubject() string               { return r.userID }
func (r *refreshToken) SetCurrentScopes(scopes []string) { r.scopes = scopes }

type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *signingKey) Key() any                                    { return k.key }
func (k *signingKey) ID() string                                  { return k.id }

type publicKey struct{ *signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }

var errNotFound = errors.New("devoidc: not found")

// storage is the provider's in-memory state.
type storage struct {
	mu       sync.Mutex
	users    map[string]*user // by username
	clients  map[string]*client
	requests map[string]*authRequest
	codes    map[string]string // code → request id
	tokens   map[string]*accessToken
	refresh  map[string]*refreshToken
	key      *signingKey
	// groupsScopeOnly: the groups claim only for the groups scope.
	groupsScopeOnly bool
}

func newStorage(c *client) (*storage, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return &storage{
		users:    map[string]*user{},
		clients:  map[string]*client{c.id: c},
		requests: map[string]*authRequest{},
		codes:    map[string]string{},
		tokens:   map[string]*accessToken{},
		refresh:  map[string]*refreshToken{},
		key:      &signingKey{id: randomID(), key: k},
	}, nil
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *storage) addUser(u *user) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[u.username] = u
}

func (s *storage) userByID(id string) *user {
	for _, u := range s.users {
		if u.id == id {
			return u
		}
	}
	return nil
}

// checkLogin marks the auth request done when the password matches.
func (s *storage) checkLogin(requestID, username, password string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	req, ok := s.requests[requestID]
	if !ok {
		return errNotFound
	}
	u, ok := s.users[username]
	if !ok || subtle.ConstantTimeCompare([]byte(u.password), []byte(password)) != 1 {
		return errors.New("wrong user name or password")
	}
	req.userID, req.done, req.authTime = u.id, true, time.Now()
	return nil
}

func (s *storage) CreateAuthRequest(_ context.Context, r *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	if slices.Contains(r.Prompt, oidc.PromptNone) {
		return nil, oidc.ErrLoginRequired()
	}
	req := &authRequest{
		id: randomID(), clientID: r.ClientID, redirectURI: r.RedirectURI, state: r.State,
		nonce: r.Nonce, scopes: r.Scopes, respType: r.ResponseType, respMode: r.ResponseMode,
		created: time.Now(),
	}
	if r.CodeChallenge != "" {
		req.challenge = &oidc.CodeChallenge{Challenge: r.CodeChallenge, Method: r.CodeChallengeMethod}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[req.id] = req
	return req, nil
}

func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.requests[id]; ok {
		return r, nil
	}
	return nil, errNotFound
}

func (s *storage) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.requests[s.codes[code]]; ok {
		return r, nil
	}
	return nil, errNotFound
}

func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.requests[id]; !ok {
		return errNotFound
	}
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest runs when a code is redeemed: the code dies with it,
// so a replayed code finds nothing.
func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

func (s *storage) CreateAccessToken(_ context.Context, r op.TokenRequest) (string, time.Time, error) {
	var clientID string
	if ar, ok := r.(op.AuthRequest); ok {
		clientID = ar.GetClientID()
	}
	id, exp := randomID(), time.Now().Add(5*time.Minute)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[id] = &accessToken{subject: r.GetSubject(), clientID: clientID, expires: exp}
	return id, exp, nil
}

// CreateAccessAndRefreshTokens issues an access token and a refresh token:
// at the code exchange (offline_access was asked for) and at each refresh,
// which rotates the presented token.
func (s *storage) CreateAccessAndRefreshTokens(_ context.Context, r op.TokenRequest, current string) (string, string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt := &refreshToken{id: randomID(), userID: r.GetSubject(), scopes: slices.Clone(r.GetScopes()), expires: time.Now().Add(24 * time.Hour)}
	switch req := r.(type) {
	case op.AuthRequest:
		rt.clientID, rt.amr, rt.authTime = req.GetClientID(), req.GetAMR(), req.GetAuthTime()
	case op.RefreshTokenRequest:
		rt.clientID, rt.amr, rt.authTime = req.GetClientID(), req.GetAMR(), req.GetAuthTime()
	}
	if current != "" {
		if _, ok := s.refresh[current]; !ok {
			return "", "", time.Time{}, op.ErrInvalidRefreshToken
		}
		delete(s.refresh, current)
	}
	s.refresh[rt.id] = rt
	id, exp := randomID(), time.Now().Add(5*time.Minute)
	s.tokens[id] = &accessToken{subject: r.GetSubject(), clientID: rt.clientID, expires: exp}
	return id, rt.id, exp, nil
}

// TokenRequestByRefreshToken finds a live refresh token of an existing user.
func (s *storage) TokenRequestByRefreshToken(_ context.Context, token string) (op.RefreshTokenRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refresh[token]
	if !ok || time.Now().After(rt.expires) || s.userByID(rt.userID) == nil {
		return nil, op.ErrInvalidRefreshToken
	}
	c := *rt
	c.scopes = slices.Clone(rt.scopes)
	return &c, nil
}

// TerminateSession: the provider keeps no single-sign-on session (every
// login shows the form), so there is nothing to end.
func (s *storage) TerminateSession(context.Context, string, string) error { return nil }

func (s *storage) RevokeToken(_ context.Context, token, _, _ string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, token)
	delete(s.refresh, token)
	return nil
}

func (s *storage) GetRefreshTokenInfo(_ context.Context, _ string, token string) (string, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rt, ok := s.refresh[token]; ok {
		return rt.userID, rt.id, nil
	}
	return "", "", op.ErrInvalidRefreshToken
}

func (s *storage) SigningKey(context.Context) (op.SigningKey, error) { return s.key, nil }
func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}
func (s *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{s.key}}, nil
}

func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[id]; ok {
		return c, nil
	}
	return nil, errNotFound
}

func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok || subtle.ConstantTimeCompare([]byte(c.secret), []byte(secret)) != 1 {
		return oidc.ErrInvalidClient()
	}
	return nil
}

func (s *storage) setUserinfo(info *oidc.UserInfo, userID string, scopes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.userByID(userID)
	if u == nil {
		return errNotFound
	}
	info.Subject = u.id
	if slices.Contains(scopes, oidc.ScopeProfile) {
		info.PreferredUsername = u.username
		info.Name = u.username
	}
	return nil
}

func (s *storage) SetUserinfoFromScopes(_ context.Context, info *oidc.UserInfo, userID, _ string, scopes []string) error {
	return s.setUserinfo(info, userID, scopes)
}

// SetUserinfoFromRequest puts the user's groups (as they are now: a
// refreshed token shows a removed group gone) in the ID token: the console
// reads its roles from them. With groupsScopeOnly, only for the groups
// scope.
func (s *storage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, r op.IDTokenRequest, _ []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groupsScopeOnly && !slices.Contains(r.GetScopes(), scopeGroups) {
		return nil
	}
	if u := s.userByID(r.GetSubject()); u != nil {
		info.AppendClaims(RolesClaim, u.groups)
	}
	return nil
}

func (s *storage) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, tokenID, _, _ string) error {
	s.mu.Lock()
	t, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok || time.Now().After(t.expires) {
		return errors.New("devoidc: token is invalid or expired")
	}
	return s.setUserinfo(info, t.subject, []string{oidc.ScopeProfile})
}

func (s *storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errors.New("devoidc: introspection is not supported")
}

func (s *storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errNotFound
}

func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("devoidc: JWT profile is not supported")
}

func (s *storage) Health(context.Context) error { return nil }
