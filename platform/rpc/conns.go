package rpc

import (
	"sync"

	"google.golang.org/grpc"
)

// Conns keeps one client connection per address, dialled with one
// configuration on first use and closed together: a process that calls
// many peers of one kind (the curator leader's followers, the consensus
// services) dials each once.
type Conns struct {
	cfg   ClientConfig
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewConns is an empty cache that dials with cfg.
func NewConns(cfg ClientConfig) *Conns {
	return &Conns{cfg: cfg, conns: map[string]*grpc.ClientConn{}}
}

// Get is the connection to addr, dialled (lazily: grpc.NewClient) the
// first time.
func (c *Conns) Get(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := Dial(addr, c.cfg)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

// Close closes every connection; a later Get dials again.
func (c *Conns) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, cc := range c.conns {
		cc.Close()
		delete(c.conns, addr)
	}
}
