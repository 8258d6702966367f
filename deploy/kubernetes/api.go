package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// API is the little of the Kubernetes API the bootstrap Job uses: get,
// create and replace Secrets and ConfigMaps in one namespace, as its
// ServiceAccount (base/bootstrap.yaml grants exactly that). No client-go:
// four REST calls do not need it.
type API struct {
	// Server is the API server's base URL.
	Server string
	// Namespace is where the objects live.
	Namespace string
	// Token returns the bearer token; it is read for every call (the
	// kubelet rotates the projected token).
	Token  func() (string, error)
	Client *http.Client
}

// The in-cluster locations of the ServiceAccount's credentials.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// InClusterAPI is the API of the cluster the pod runs in, as its
// ServiceAccount.
func InClusterAPI() (*API, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset")
	}
	ns, err := os.ReadFile(serviceAccountDir + "/namespace")
	if err != nil {
		return nil, fmt.Errorf("the pod's namespace: %w", err)
	}
	caPEM, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the API server's CA: no certificate in " + serviceAccountDir + "/ca.crt")
	}
	return &API{
		Server:    "https://" + net.JoinHostPort(host, port),
		Namespace: strings.TrimSpace(string(ns)),
		Token: func() (string, error) {
			b, err := os.ReadFile(serviceAccountDir + "/token")
			return strings.TrimSpace(string(b)), err
		},
		Client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		}},
	}, nil
}

// ErrNotFound and ErrExists are the API's 404 and 409.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
)

// Get reads the named object of resource ("secrets", "configmaps") into out.
func (a *API) Get(ctx context.Context, resource, name string, out any) error {
	return a.do(ctx, http.MethodGet, a.path(resource, name), nil, out)
}

// Create creates obj; ErrExists when an object of its name exists.
func (a *API) Create(ctx context.Context, resource string, obj any) error {
	return a.do(ctx, http.MethodPost, a.path(resource, ""), obj, nil)
}

// Replace replaces the named object with obj (no resourceVersion: the
// last writer wins).
func (a *API) Replace(ctx context.Context, resource, name string, obj any) error {
	return a.do(ctx, http.MethodPut, a.path(resource, name), obj, nil)
}

// Apply creates obj, or replaces the object of its name.
func (a *API) Apply(ctx context.Context, resource, name string, obj any) error {
	err := a.Create(ctx, resource, obj)
	if errors.Is(err, ErrExists) {
		return a.Replace(ctx, resource, name, obj)
	}
	return err
}

func (a *API) path(resource, name string) string {
	p := "/api/v1/namespaces/" + url.PathEscape(a.Namespace) + "/" + resource
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

func (a *API) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.Server+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.Token != nil {
		token, err := a.Token()
		if err != nil {
			return fmt.Errorf("service account token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := a.Client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s %s: %w", method, path, ErrNotFound)
	case resp.StatusCode == http.StatusConflict && method == http.MethodPost:
		return fmt.Errorf("%s %s: %w", method, path, ErrExists)
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}
