package e2b

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// E2B's secrets (the SDK's Secret class: POST/GET /secrets, GET, POST,
// DELETE /secrets/{secretID}) are torpor's tenant secrets
// (docs/secrets.md): the same sealed store, the same names, so a secret
// set with the SDK is referenced by a native create and one set with
// `torpor secrets set` is listed by the SDK. No answer carries a value.
//
// What E2B adds is mapped thus:
//   - secretID is "sec_" and 24 hex digits of a hash of the tenant, the
//     name and the creation time: stable while the secret lives, new when
//     it is deleted and made again. It is looked up among the tenant's
//     secrets, so it never finds another tenant's.
//   - Names are lower-cased at create, as E2B does; a lookup by name tries
//     the name as given (a native secret may have capitals), then
//     lower-cased. "sec_" starts identifiers, not names.
//   - Metadata is not kept: a create or update with metadata is refused
//     (400 naming it), and answers carry an empty one.

// secretAnswer is E2B's Secret: metadata, never the value.
type secretAnswer struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

// newSecret is the body of POST /secrets; secretUpdate of POST
// /secrets/{secretID}.
type newSecret struct {
	Name     *string           `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

type secretUpdate struct {
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

const secretIDPrefix = "sec_"

// secretID is the E2B identifier of tenant's secret sec.
func secretID(tenant string, sec torpor.Secret) string {
	h := sha256.Sum256([]byte("torpor e2b secret\x00" + tenant + "\x00" + sec.Name + "\x00" +
		strconv.FormatInt(sec.CreatedAt.UnixMicro(), 10)))
	return secretIDPrefix + hex.EncodeToString(h[:12])
}

func toSecretAnswer(tenant string, sec torpor.Secret) secretAnswer {
	return secretAnswer{
		SecretID: secretID(tenant, sec), Name: sec.Name, CurrentVersion: sec.Version,
		Metadata: map[string]string{}, CreatedAt: sec.CreatedAt.UTC(), UpdatedAt: sec.UpdatedAt.UTC(),
	}
}

func noSecretMetadata(md map[string]string) error {
	if len(md) > 0 {
		return torpor.Invalid("metadata", "secret metadata is not supported by torpor")
	}
	return nil
}

// secretValue checks a body's value; the error never carries it.
func secretValue(v *string) ([]byte, error) {
	if v == nil {
		return nil, torpor.Invalid("value", "value is required")
	}
	return []byte(*v), torpor.ValidateSecretValue([]byte(*v))
}

func secretNotFound(ref string) error {
	if len(ref) > 80 {
		ref = ref[:80] + "…"
	}
	return torpor.Errorf(torpor.ENotFound, "no secret %q", ref)
}

// findSecret answers tenant's secret that ref names: an identifier, or a
// name as given, or lower-cased.
func (a *API) findSecret(r *http.Request, tenant, ref string) (torpor.Secret, error) {
	if rest, ok := strings.CutPrefix(ref, secretIDPrefix); ok && len(rest) == 24 {
		secs, err := a.eng.ListSecrets(r.Context(), tenant)
		if err != nil {
			return torpor.Secret{}, err
		}
		for _, sec := range secs {
			if secretID(tenant, sec) == ref {
				return sec, nil
			}
		}
	}
	for i, name := range []string{ref, strings.ToLower(ref)} {
		if i == 1 && name == ref {
			break
		}
		if torpor.ValidateSecretName(name) != nil {
			continue
		}
		sec, err := a.eng.GetSecret(r.Context(), tenant, name)
		if err == nil {
			return sec, nil
		}
		if !torpor.IsCode(err, torpor.ENotFound) {
			return torpor.Secret{}, err
		}
	}
	return torpor.Secret{}, secretNotFound(ref)
}

// createSecret is Secret.create: a new secret, 409 when the name is
// taken.
func (a *API) createSecret(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var req newSecret
	if _, err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == nil {
		return torpor.Invalid("name", "name is required")
	}
	name := strings.ToLower(*req.Name)
	if err := torpor.ValidateSecretName(name); err != nil {
		return err
	}
	if strings.HasPrefix(name, secretIDPrefix) {
		return torpor.Invalid("name", "names starting with %q are reserved for secret identifiers", secretIDPrefix)
	}
	value, err := secretValue(req.Value)
	if err != nil {
		return err
	}
	if err := noSecretMetadata(req.Metadata); err != nil {
		return err
	}
	// The store's set creates or rotates; the lock makes this check and
	// set one step for the E2B calls of this daemon.
	a.secMu.Lock()
	defer a.secMu.Unlock()
	if _, err := a.eng.GetSecret(r.Context(), tenant, name); err == nil {
		return torpor.Errorf(torpor.EConflict, "secret %q already exists", name)
	} else if !torpor.IsCode(err, torpor.ENotFound) {
		return err
	}
	sec, err := a.eng.SetSecret(r.Context(), tenant, name, value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toSecretAnswer(tenant, sec))
	return nil
}

// updateSecret is Secret.update: a new value, the version moves on; 404
// for a secret that does not exist.
func (a *API) updateSecret(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var req secretUpdate
	if _, err := decode(r, &req); err != nil {
		return err
	}
	value, err := secretValue(req.Value)
	if err != nil {
		return err
	}
	if err := noSecretMetadata(req.Metadata); err != nil {
		return err
	}
	a.secMu.Lock()
	defer a.secMu.Unlock()
	sec, err := a.findSecret(r, tenant, r.PathValue("secretID"))
	if err != nil {
		return err
	}
	sec, err = a.eng.SetSecret(r.Context(), tenant, sec.Name, value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toSecretAnswer(tenant, sec))
	return nil
}

func (a *API) getSecret(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	sec, err := a.findSecret(r, tenant, r.PathValue("secretID"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toSecretAnswer(tenant, sec))
	return nil
}

// deleteSecret is Secret.destroy: 204, or 404 (destroy returns false).
func (a *API) deleteSecret(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	a.secMu.Lock()
	defer a.secMu.Unlock()
	sec, err := a.findSecret(r, tenant, r.PathValue("secretID"))
	if err != nil {
		return err
	}
	if err := a.eng.DeleteSecret(r.Context(), tenant, sec.Name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listSecrets is Secret.list: the tenant's secrets by name, in pages of
// limit (at most 100, 100 by default) with X-Next-Token when more follow.
func (a *API) listSecrets(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	q := r.URL.Query()
	limit := maxLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return torpor.Invalid("limit", "limit must be between 1 and %d", maxLimit)
		}
		limit = n
	}
	after := ""
	if v := q.Get("nextToken"); v != "" {
		raw, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || torpor.ValidateSecretName(string(raw)) != nil {
			return torpor.Invalid("nextToken", "nextToken is not one this server gave")
		}
		after = string(raw)
	}
	secs, err := a.eng.ListSecrets(r.Context(), tenant)
	if err != nil {
		return err
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i].Name < secs[j].Name })
	out := []secretAnswer{}
	for _, sec := range secs {
		if after != "" && sec.Name <= after {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(out[len(out)-1].Name)))
			break
		}
		out = append(out, toSecretAnswer(tenant, sec))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
