package envoyrls

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/admitdev/admit/internal/connlimit"
)

// ServiceName is the gRPC name of the rate limit service, as the health
// service knows it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// MaxMessageSize bounds a request message: what one stream can make the
// server buffer (a message is read whole before it is decoded). A request
// of 64 descriptors of a few entries each fits many times over.
const MaxMessageSize = 64 << 10

// The bounds of what a client, authenticated or not, can make the server
// hold (docs/security.md has what each costs).
const (
	// MaxStreams bounds the streams one connection has open at once; the
	// server tells clients so (SETTINGS_MAX_CONCURRENT_STREAMS) and
	// refuses more.
	MaxStreams = 100
	// UnaryTimeout bounds a unary call from its headers to its answer:
	// a stream opened and never sent its message is ended then.
	// StreamTimeout bounds a streaming call (a health Watch): its client
	// watches again.
	UnaryTimeout  = 10 * time.Second
	StreamTimeout = 5 * time.Minute
	// HandshakeTimeout bounds a connection's TLS and HTTP/2 handshake: a
	// connection that never says it speaks HTTP/2 is closed then.
	HandshakeTimeout = 10 * time.Second
	// MaxConnectionIdle closes a connection without a stream for so long;
	// MaxConnectionAge closes any connection, its streams given
	// MaxConnectionAgeGrace to finish (clients reconnect).
	MaxConnectionIdle     = 5 * time.Minute
	MaxConnectionAge      = 30 * time.Minute
	MaxConnectionAgeGrace = 30 * time.Second
	// A client that sends nothing for KeepaliveTime is pinged, and its
	// connection closed if it does not answer within KeepaliveTimeout.
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 5 * time.Second
	// DefaultMaxConnections bounds the connections served at once, and
	// MaxConnectionsPerIP those of one client address: past either, a new
	// connection is closed at once. (An Envoy opens one or a few a worker
	// thread.)
	DefaultMaxConnections      = 512
	DefaultMaxConnectionsPerIP = 32
	// A connection whose streams mostly end before they are calls (reset
	// or left without their message, as in a rapid-reset flood,
	// CVE-2023-44487) is closed once more than MaxUncalledStreams of them
	// are, besides MaxStreams that may still become calls, and its client
	// address refused connections for
	// UncalledPenalty. A client that opened it again at once would cost
	// the server its handshake and that many streams each time. Envoy
	// sends a call's message with its headers, and resets only calls it
	// gave up waiting for, which are calls.
	MaxUncalledStreams = 2 * MaxStreams
	UncalledPenalty    = 10 * time.Second
)

// Server serves a Service over gRPC, with the standard health service
// (grpc.health.v1) and, on request, server reflection. Create it with
// NewServer.
type Server struct {
	grpc      *grpc.Server
	health    *health.Server
	ready     func(context.Context) error
	stop      chan struct{}
	pollEvery time.Duration
	once      sync.Once
	limits    connlimit.Limits
	ln        atomic.Pointer[connlimit.Listener]
	uncalled  atomic.Int64 // connections closed for their uncalled streams
	quota     bool         // the quota service is served too
}

// ConnStats counts the gRPC port's connections.
type ConnStats struct {
	Open     int64 // served now
	Refused  int64 // closed at once: past a bound, or from a penalized address
	Uncalled int64 // closed for streams that were not calls
}

// NewServer returns a gRPC server for svc. ready, if set, is polled every
// few seconds while serving: the health service answers NOT_SERVING while
// it fails (the store is down), as envoyproxy/ratelimit's health check does
// with Redis. opts are added to ServerOptions (TLS credentials, for one).
func NewServer(svc *Service, ready func(context.Context) error, opts ...grpc.ServerOption) *Server {
	g := grpc.NewServer(append(append(ServerOptions(), plaintext()), opts...)...)
	h := health.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	healthpb.RegisterHealthServer(g, h)
	return &Server{grpc: g, health: h, ready: ready, stop: make(chan struct{}), pollEvery: 2 * time.Second,
		limits: connlimit.Limits{Max: DefaultMaxConnections, MaxPerIP: DefaultMaxConnectionsPerIP}}
}

// SetMaxConnections sets how many connections are served at once, and
// from one client address (each at least 1; 0 keeps the default:
// DefaultMaxConnections, DefaultMaxConnectionsPerIP). Call it before
// Serve.
func (s *Server) SetMaxConnections(all, perIP int) {
	if all > 0 {
		s.limits.Max = all
	}
	if perIP > 0 {
		s.limits.MaxPerIP = perIP
	}
}

// Connections counts the connections served now and those closed.
func (s *Server) Connections() ConnStats {
	st := ConnStats{Uncalled: s.uncalled.Load()}
	if ln := s.ln.Load(); ln != nil {
		c := ln.Stats()
		st.Open, st.Refused = c.Open, c.Refused
	}
	return st
}

// ServeQuota serves q, Envoy's rate limit quota service, beside the rate
// limit service, with its health (QuotaServiceName) following the same
// readiness. Call it before Serve.
func (s *Server) ServeQuota(q *QuotaService) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(s.grpc, q)
	s.quota = true
}

// RegisterService serves another service on the port (Kuadrant's rate
// limit RPCs, say), with the same connections, bounds and readiness:
// Server is a grpc.ServiceRegistrar. Call it before Serve.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(desc, impl)
}

var _ grpc.ServiceRegistrar = (*Server)(nil)

// EnableReflection serves gRPC server reflection, so that tools such as
// grpcurl need no .proto files. It is off by default: it tells anyone who
// reaches the port what the server offers. Call it before Serve.
func (s *Server) EnableReflection() { reflection.Register(s.grpc) }

// ServerOptions returns the options NewServer creates its gRPC server
// with; benchmarks build their ceiling server with them too, so that both
// sides of a comparison run on the same stack.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.MaxConcurrentStreams(MaxStreams),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.InTapHandle(tapStream),
		grpc.ForceServerCodecV2(textCodec{encoding.GetCodecV2(protoenc.Name)}),
		grpc.ChainUnaryInterceptor(refuseBadText),
		grpc.ChainStreamInterceptor(refuseBadTextStream),
		// Envoy keeps its connections to the service open; pings keep
		// them alive through middleboxes without letting clients flood.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// A client silent for KeepaliveTime is pinged, and its connection
		// closed if it does not answer within KeepaliveTimeout: what was
		// sent to a client that stopped reading is then never delivered,
		// which bounds how late a quota assignment can reach its Envoy.
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: MaxConnectionIdle, MaxConnectionAge: MaxConnectionAge, MaxConnectionAgeGrace: MaxConnectionAgeGrace,
			Time: KeepaliveTime, Timeout: KeepaliveTimeout,
		}),
	}
}

// textCodec is gRPC's protobuf codec, but for a message whose string
// fields are not UTF-8, which it would refuse as INTERNAL (a failure of
// the server, which an Envoy admits on like any other): it takes such a
// message as empty and marks it, and refuseBadText answers it
// INVALID_ARGUMENT.
type textCodec struct{ encoding.CodecV2 }

// badText holds the messages textCodec took as empty, until refuseBadText
// answers them; badTexts counts them, so that the usual call, with none
// held, costs one atomic read.
var (
	badText  sync.Map
	badTexts atomic.Int64
)

// takeBadText reports whether m is a message textCodec took as empty, and
// forgets it.
func takeBadText(m any) bool {
	if badTexts.Load() == 0 {
		return false
	}
	if _, bad := badText.LoadAndDelete(m); bad {
		badTexts.Add(-1)
		return true
	}
	return false
}

func (c textCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err != nil && strings.Contains(err.Error(), "invalid UTF-8") {
		if m, ok := v.(proto.Message); ok {
			proto.Reset(m)
			badTexts.Add(1)
			badText.Store(v, err.Error())
			return nil
		}
	}
	return err
}

const badTextMessage = "a string field of the request is not UTF-8 text"

func refuseBadText(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if takeBadText(req) {
		return nil, status.Error(codes.InvalidArgument, badTextMessage)
	}
	return handler(ctx, req)
}

func refuseBadTextStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, textStream{ss})
}

// textStream refuses, as refuseBadText does, a message of a stream.
type textStream struct{ grpc.ServerStream }

func (s textStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if takeBadText(m) {
		return status.Error(codes.InvalidArgument, badTextMessage)
	}
	return nil
}

// streaming are the methods served that stream, with how long a stream
// of each may last: StreamTimeout, but a quota stream, which an Envoy keeps
// open for as long as it runs, lasts as long as its connection may
// (MaxConnectionAge): each new stream is a new holder of the limits'
// shares, its old one counted until its assignments expire.
var streaming = map[string]time.Duration{
	"/grpc.health.v1.Health/Watch":                                   StreamTimeout,
	"/" + QuotaServiceName + "/StreamRateLimitQuotas":                MaxConnectionAge + MaxConnectionAgeGrace,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      StreamTimeout,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": StreamTimeout,
}

// tapStream runs on a connection's reader for each stream it opens. It
// gives a unary call UnaryTimeout from its headers, a streaming one its
// time in streaming: the context it returns is the stream's, which the
// read of the call's message waits on, so a stream that never sends it is
// ended then rather than held.
func tapStream(ctx context.Context, info *tap.Info) (context.Context, error) {
	d := UnaryTimeout
	if sd, ok := streaming[info.FullMethodName]; ok {
		d = sd
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	_ = cancel // the stream's end cancels its context, and this timer with it
	return ctx, nil
}

// streamsListener accepts the connections of a connlimit.Listener, each
// as a countedConn.
type streamsListener struct {
	*connlimit.Listener
	s *Server
}

func (l streamsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c.(*connlimit.Conn), s: l.s, ln: l.Listener}, nil
}

// countedConn is a served connection, with the streams it opened and the
// calls they made.
type countedConn struct {
	*connlimit.Conn
	s       *Server
	ln      *connlimit.Listener
	streams atomic.Int64
	calls   atomic.Int64
	closed  atomic.Bool
}

// opened counts a stream (its HEADERS frame, refused or not) and reports
// whether the connection is within MaxUncalledStreams streams that were
// not calls, besides MaxStreams that may still be, or more than half its
// streams calls.
func (c *countedConn) opened() bool {
	streams := c.streams.Add(1)
	// Up to MaxStreams may be open, their calls still to come.
	uncalled := streams - c.calls.Load() - MaxStreams
	return uncalled <= MaxUncalledStreams || 2*uncalled <= streams
}

// shut closes a connection past a bound, and penalizes its address.
func (c *countedConn) shut() {
	if c.closed.CompareAndSwap(false, true) {
		c.s.uncalled.Add(1)
		c.ln.Penalize(c.IP(), UncalledPenalty)
	}
	c.Close()
}

// Serve accepts connections on ln until Stop. It returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
	s.setServing(true)
	if s.ready != nil {
		go s.pollReady()
	}
	cl := connlimit.New(ln, s.limits)
	s.ln.Store(cl)
	err := s.grpc.Serve(streamsListener{Listener: cl, s: s})
	if err == grpc.ErrServerStopped {
		return nil
	}
	return err
}

func (s *Server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
	if s.quota {
		s.health.SetServingStatus(QuotaServiceName, st)
	}
}

func (s *Server) pollReady() {
	t := time.NewTicker(s.pollEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := s.ready(ctx)
		cancel()
		select {
		case <-s.stop:
			return // Stop's NOT_SERVING stands
		default:
		}
		s.setServing(err == nil)
	}
}

// Stop reports NOT_SERVING, stops accepting calls and waits for the calls
// in flight until ctx ends, then closes what is left.
func (s *Server) Stop(ctx context.Context) {
	first := false
	s.once.Do(func() { first = true; close(s.stop) })
	if !first {
		return
	}
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}
