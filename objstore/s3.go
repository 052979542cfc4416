package objstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/torpor-dev/torpor"
)

// The environment variables that hold the S3 credentials; the AWS ones are
// read only when neither of torpor's own is set.
const (
	envAccessKey    = "TORPOR_S3_ACCESS_KEY"
	envSecretKey    = "TORPOR_S3_SECRET_KEY"
	envAWSAccessKey = "AWS_ACCESS_KEY_ID"
	envAWSSecretKey = "AWS_SECRET_ACCESS_KEY"
	envAWSToken     = "AWS_SESSION_TOKEN"
)

// awsEndpoint is where a URL without an endpoint option goes.
const awsEndpoint = "https://s3.amazonaws.com"

// partSize is the size of the parts of a multipart upload. An upload holds
// a few parts in memory at a time (one for a stream of unknown size, one
// per worker otherwise), whatever the size of the object; with S3's limit
// of 10,000 parts it allows objects of up to 160 GiB.
const partSize = 16 << 20

// maxRetries is how many times the client sends a request that failed for
// a reason worth another try (a refused connection, a 5xx answer) before
// it gives up. The waits between tries grow from 200 ms to at most 1 s,
// so an unreachable store fails a call within a few seconds, and the
// caller, which knows whether the work can wait, decides what next.
const maxRetries = 4

// dialTimeout bounds how long the client waits for a TCP connection.
const dialTimeout = 5 * time.Second

// s3Store is a bucket, or the part of it under a prefix, of an
// S3-compatible store.
type s3Store struct {
	client *minio.Client
	bucket string
	prefix string // "" or a valid key ending in "/"
	where  string
}

func openS3(ctx context.Context, u *url.URL) (*s3Store, error) {
	q := u.Query()
	if err := checkOptions(q, "endpoint", "region", "path_style", "create_bucket"); err != nil {
		return nil, err
	}
	bucket := u.Host
	if err := s3utils.CheckValidBucketNameStrict(bucket); err != nil {
		return nil, torpor.Invalid("url", "the object store URL's bucket %q is not a valid bucket name: %v", bucket, err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := checkKey("url", prefix); err != nil {
			return nil, torpor.Invalid("url", "the object store URL's prefix %q is not a valid key path", prefix)
		}
		prefix += "/"
	}

	rawEndpoint := q.Get("endpoint")
	if rawEndpoint == "" {
		rawEndpoint = awsEndpoint
	}
	ep, err := url.Parse(rawEndpoint)
	if err != nil || ep.User != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "" ||
		strings.Trim(ep.Path, "/") != "" || ep.RawQuery != "" {
		return nil, torpor.Invalid("url", "the object store URL's endpoint must be http://HOST[:PORT] or https://HOST[:PORT], without credentials or a path")
	}
	secure := ep.Scheme == "https"

	lookup := minio.BucketLookupAuto
	if v := q.Get("path_style"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, torpor.Invalid("url", "the object store URL's path_style must be true or false, not %q", v)
		}
		lookup = minio.BucketLookupDNS
		if b {
			lookup = minio.BucketLookupPath
		}
	}
	create := false
	if v := q.Get("create_bucket"); v != "" {
		if create, err = strconv.ParseBool(v); err != nil {
			return nil, torpor.Invalid("url", "the object store URL's create_bucket must be true or false, not %q", v)
		}
	}
	region := q.Get("region")

	creds, err := envCredentials()
	if err != nil {
		return nil, err
	}
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, fmt.Errorf("objstore: %w", err)
	}
	tr.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	client, err := minio.New(ep.Host, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Transport:    tr,
		Region:       region,
		BucketLookup: lookup,
		MaxRetries:   maxRetries,
	})
	if err != nil {
		return nil, torpor.Invalid("url", "the object store URL's endpoint is refused: %v", err)
	}

	// Where shows what tells one store from another, and no secret:
	// there is none in the URL to begin with.
	// It is left unescaped, for people to read.
	var opts []string
	if q.Get("endpoint") != "" {
		opts = append(opts, "endpoint="+ep.Scheme+"://"+ep.Host)
	}
	if region != "" {
		opts = append(opts, "region="+region)
	}
	if q.Get("path_style") != "" {
		opts = append(opts, "path_style="+strconv.FormatBool(lookup == minio.BucketLookupPath))
	}
	where := "s3://" + bucket
	if prefix != "" {
		where += "/" + strings.TrimSuffix(prefix, "/")
	}
	if len(opts) > 0 {
		where += "?" + strings.Join(opts, "&")
	}
	s := &s3Store{client: client, bucket: bucket, prefix: prefix, where: where}

	ok, err := client.BucketExists(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("objstore: look for bucket %q at %s: %w", bucket, s.where, err)
	}
	if !ok {
		if !create {
			return nil, torpor.Errorf(torpor.ENotFound, "the bucket %q does not exist at %s; make it, or add create_bucket=true to the URL", bucket, s.where)
		}
		err := client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: region})
		// Nodes that start together may race to make the bucket; the
		// losers find it made, which is what they wanted.
		if code := minio.ToErrorResponse(err).Code; err != nil && code != "BucketAlreadyOwnedByYou" && code != "BucketAlreadyExists" {
			return nil, fmt.Errorf("objstore: make bucket %q at %s: %w", bucket, s.where, err)
		}
	}
	return s, nil
}

// envCredentials reads the S3 credentials from the environment.
func envCredentials() (*credentials.Credentials, error) {
	key, secret, token := os.Getenv(envAccessKey), os.Getenv(envSecretKey), ""
	keyVar, secretVar := envAccessKey, envSecretKey
	if key == "" && secret == "" {
		key, secret, token = os.Getenv(envAWSAccessKey), os.Getenv(envAWSSecretKey), os.Getenv(envAWSToken)
		keyVar, secretVar = envAWSAccessKey, envAWSSecretKey
	}
	switch {
	case key == "" && secret == "":
		return nil, torpor.Invalid("url", "no S3 credentials: set %s and %s (or %s and %s)", envAccessKey, envSecretKey, envAWSAccessKey, envAWSSecretKey)
	case key == "":
		return nil, torpor.Invalid("url", "%s is set but %s is not", secretVar, keyVar)
	case secret == "":
		return nil, torpor.Invalid("url", "%s is set but %s is not", keyVar, secretVar)
	}
	return credentials.NewStaticV4(key, secret, token), nil
}

func (s *s3Store) Where() string { return s.where }

func (s *s3Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := checkKey("key", key); err != nil {
		return err
	}
	if size < 0 {
		// A stream of unknown size that fits in a part goes as one
		// PUT of known size: one request rather than three, one that
		// can be sent again (minio-go retries only what it can read
		// again), and an empty object, which some servers refuse as a
		// multipart upload's only part.
		var head bytes.Buffer
		n, err := head.ReadFrom(io.LimitReader(ctxReader{ctx: ctx, r: r}, partSize))
		if err != nil {
			return fmt.Errorf("objstore: put %s in %s: read: %w", key, s.where, err)
		}
		if n < partSize {
			r, size = bytes.NewReader(head.Bytes()), n
		} else {
			r = io.MultiReader(&head, r)
		}
	}
	// A single PUT and the completion of a multipart upload are both
	// atomic in S3, and minio-go aborts a multipart upload that fails, so
	// a key is wholly written or not at all.
	_, err := s.client.PutObject(ctx, s.bucket, s.prefix+key, r, size, minio.PutObjectOptions{
		PartSize:    partSize,
		ContentType: "application/octet-stream",
		// Over plain HTTP minio-go signs an upload chunk by chunk
		// (aws-chunked); for an empty object it declares no body but
		// sends the closing chunk anyway, which a server reads as the
		// start of the connection's next request and answers with a
		// 400 that the client's next request then reads as its own. An
		// empty body signed whole is no cost.
		DisableContentSha256: size == 0,
	})
	if err != nil {
		return fmt.Errorf("objstore: put %s in %s: %w", key, s.where, err)
	}
	return nil
}

func (s *s3Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey("key", key); err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("objstore: get %s from %s: %w", key, s.where, err)
	}
	// GetObject sends nothing until the object is first used; Stat sends
	// the GET, so that a missing key is known here and not at the first
	// Read.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, torpor.Errorf(torpor.ENotFound, "no object %s in %s", key, s.where)
		}
		return nil, fmt.Errorf("objstore: get %s from %s: %w", key, s.where, err)
	}
	return obj, nil
}

func (s *s3Store) Delete(ctx context.Context, key string) error {
	if err := checkKey("key", key); err != nil {
		return err
	}
	err := s.client.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code != minio.NoSuchKey {
		return fmt.Errorf("objstore: delete %s from %s: %w", key, s.where, err)
	}
	return nil
}
