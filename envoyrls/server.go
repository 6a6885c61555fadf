package envoyrls

import (
	"context"
	"net"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// ServiceName is the gRPC name of the rate limit service, as the health
// service knows it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// MaxMessageSize bounds a request message.
const MaxMessageSize = 1 << 20

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
}

// NewServer returns a gRPC server for svc. ready, if set, is polled every
// few seconds while serving: the health service answers NOT_SERVING while
// it fails (the store is down), as envoyproxy/ratelimit's health check does
// with Redis. opts are added to ServerOptions (TLS credentials, for one).
func NewServer(svc *Service, ready func(context.Context) error, opts ...grpc.ServerOption) *Server {
	g := grpc.NewServer(append(ServerOptions(), opts...)...)
	h := health.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	healthpb.RegisterHealthServer(g, h)
	return &Server{grpc: g, health: h, ready: ready, stop: make(chan struct{}), pollEvery: 2 * time.Second}
}

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
		// Envoy keeps its connections to the service open; pings keep
		// them alive through middleboxes without letting clients flood.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

// Serve accepts connections on ln until Stop. It returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
	s.setServing(true)
	if s.ready != nil {
		go s.pollReady()
	}
	err := s.grpc.Serve(ln)
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
