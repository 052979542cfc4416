// Package objstore opens the fleet's object store (torpor.ObjectStore) from
// a URL: an S3-compatible bucket, or a directory on the host such as a
// shared NFS mount (docs/fleet.md).
//
//	s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&path_style=BOOL&create_bucket=BOOL]
//	file:///ABSOLUTE/DIR
//
// The S3 credentials come from the environment, never from the URL, so
// that the URL can be logged and kept in configuration files:
// TORPOR_S3_ACCESS_KEY and TORPOR_S3_SECRET_KEY, or else AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.
package objstore

import (
	"context"
	"errors"
	"net/url"
	"strings"

	"github.com/torpor-dev/torpor"
)

// Open returns the object store rawURL names. A URL that does not parse,
// has an unknown scheme or option, or carries credentials is invalid;
// Open fails too when the bucket or directory does not exist (an S3 URL
// may ask for the bucket to be made with create_bucket=true).
func Open(ctx context.Context, rawURL string) (torpor.ObjectStore, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// A url.Error quotes the whole URL, which may hold a secret
		// someone put there by mistake; only the reason is kept.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, torpor.Invalid("url", "the object store URL does not parse: %v", err)
	}
	if u.User != nil {
		return nil, torpor.Invalid("url", "the object store URL may not hold credentials; set %s and %s instead", envAccessKey, envSecretKey)
	}
	switch u.Scheme {
	case "s3":
		return openS3(ctx, u)
	case "file":
		return openDir(u)
	default:
		return nil, torpor.Invalid("url", "the object store URL's scheme %q is none of s3 and file", u.Scheme)
	}
}

// maxKeyLen is S3's limit on the length of a key (prefix included).
const maxKeyLen = 1024

// checkKey refuses a key that is not a slash-separated path of
// [A-Za-z0-9._-] segments, none of them "." or "..", so that a key names
// the same object in a bucket and in a directory and can never climb out
// of the directory.
func checkKey(param, key string) error {
	if key == "" {
		return torpor.Invalid(param, "an object key may not be empty")
	}
	if len(key) > maxKeyLen {
		return torpor.Invalid(param, "an object key may have at most %d bytes", maxKeyLen)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if seg == "" {
			return torpor.Invalid(param, "the object key %q has an empty segment (a leading, trailing or doubled slash)", key)
		}
		if seg == "." || seg == ".." {
			return torpor.Invalid(param, "the object key %q has a %q segment", key, seg)
		}
		for _, c := range seg {
			if !keyChar(c) {
				return torpor.Invalid(param, "the object key %q has the character %q; keys are slash-separated segments of A-Z, a-z, 0-9, '.', '_' and '-'", key, c)
			}
		}
	}
	return nil
}

func keyChar(c rune) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// checkOptions refuses query options other than those allowed, so that a
// misspelt option is not silently ignored.
func checkOptions(q url.Values, allowed ...string) error {
	for k := range q {
		known := false
		for _, a := range allowed {
			known = known || k == a
		}
		if !known {
			if len(allowed) == 0 {
				return torpor.Invalid("url", "the object store URL has the option %q; this kind takes none", k)
			}
			return torpor.Invalid("url", "the object store URL has the unknown option %q (known: %s)", k, strings.Join(allowed, ", "))
		}
	}
	return nil
}
