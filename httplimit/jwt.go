package httplimit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// JWTKey is a key that bearer tokens may be signed with.
type JWTKey struct {
	// ID, if set, is matched against a token's "kid"; a key without one
	// verifies tokens of its algorithm whatever their kid.
	ID string
	// Alg is HS256, RS256 or ES256. A token is verified only with a key of
	// its own algorithm, so an RSA public key is never used as an HMAC
	// secret, and "alg": "none" matches no key.
	Alg string
	// Secret is the HS256 secret, at least 32 bytes.
	Secret []byte
	// Public is the RS256 (*rsa.PublicKey, at least 2048 bits) or ES256
	// (*ecdsa.PublicKey on P-256) key.
	Public any
}

// JWT configures the identification of users (and optionally tenants) by
// signed bearer tokens. Tokens must be signed by one of Keys, carry an
// expiry ("exp") that has not passed, and match Issuer and Audience when
// those are set.
type JWT struct {
	Keys []JWTKey
	// UserClaim names the claim that holds the user id; default "sub".
	UserClaim string
	// TenantClaim, if set, names a claim that holds the tenant id.
	TenantClaim string
	Issuer      string
	Audience    string
	// Leeway is the clock skew allowed on exp, nbf and iat.
	Leeway time.Duration
	// Now reads the clock; default time.Now. Tests set it.
	Now func() time.Time
}

// verifier checks tokens against a JWT configuration.
type verifier struct {
	cfg    JWT
	parser *jwt.Parser
}

func newVerifier(cfg JWT) (*verifier, error) {
	if len(cfg.Keys) == 0 {
		return nil, optionError("JWT.Keys", -1, "jwt: no keys")
	}
	var algs []string
	for i, k := range cfg.Keys {
		if err := checkKey(k); err != nil {
			return nil, optionError("JWT.Keys", i, "jwt: key %d: %v", i, err)
		}
		algs = append(algs, k.Alg)
	}
	if cfg.UserClaim == "" {
		cfg.UserClaim = "sub"
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(algs), jwt.WithExpirationRequired(), jwt.WithLeeway(cfg.Leeway)}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(cfg.Now))
	}
	return &verifier{cfg: cfg, parser: jwt.NewParser(opts...)}, nil
}

func checkKey(k JWTKey) error {
	switch k.Alg {
	case "HS256":
		if len(k.Secret) < 32 {
			return fmt.Errorf("an HS256 secret must have at least 32 bytes, this one has %d", len(k.Secret))
		}
	case "RS256":
		pk, ok := k.Public.(*rsa.PublicKey)
		if !ok {
			return fmt.Errorf("RS256 needs an RSA public key, got %T", k.Public)
		}
		if pk.N.BitLen() < 2048 {
			return fmt.Errorf("RS256 keys must have at least 2048 bits, this one has %d", pk.N.BitLen())
		}
	case "ES256":
		pk, ok := k.Public.(*ecdsa.PublicKey)
		if !ok || pk.Curve != elliptic.P256() {
			return fmt.Errorf("ES256 needs an ECDSA P-256 public key, got %T", k.Public)
		}
	default:
		return fmt.Errorf("algorithm %q: want HS256, RS256 or ES256", k.Alg)
	}
	return nil
}

// claims is what a verified token says.
type claims struct {
	user, tenant string
}

// verify checks a token and returns its user and tenant claims.
func (v *verifier) verify(token string) (claims, error) {
	var mc jwt.MapClaims
	_, err := v.parser.ParseWithClaims(token, &mc, v.key)
	if err != nil {
		return claims{}, err
	}
	var c claims
	if c.user, err = claimString(mc, v.cfg.UserClaim); err != nil {
		return claims{}, err
	}
	if v.cfg.TenantClaim != "" {
		if c.tenant, err = claimString(mc, v.cfg.TenantClaim); err != nil {
			return claims{}, err
		}
	}
	return c, nil
}

// key picks the verification keys for a token: those of the token's own
// algorithm, and of its kid when the key names one. The token is valid if
// any of them verifies it, so that keys without kids (an old and a new one
// while a signing key rotates, say) are all tried, not only the first.
func (v *verifier) key(t *jwt.Token) (any, error) {
	alg, _ := t.Header["alg"].(string)
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	for _, k := range v.cfg.Keys {
		if k.Alg != alg || (k.ID != "" && k.ID != kid) {
			continue
		}
		if k.Alg == "HS256" {
			set.Keys = append(set.Keys, k.Secret)
		} else {
			set.Keys = append(set.Keys, k.Public)
		}
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no key for alg %q kid %q", alg, kid)
	}
	return set, nil
}

// claimString returns a claim as text: a string, or an integer id. An
// absent claim is empty.
func claimString(mc jwt.MapClaims, name string) (string, error) {
	switch v := mc[name].(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case float64:
		if v == float64(int64(v)) {
			return strconv.FormatInt(int64(v), 10), nil
		}
	}
	return "", fmt.Errorf("claim %q is not a string or an integer", name)
}

// looksLikeJWT reports whether a bearer credential has a JWT's compact
// form (three dot-separated parts); API keys have no dots.
func looksLikeJWT(s string) bool { return strings.Count(s, ".") == 2 }
