package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/admitdev/admit/yamlconf"
)

// RateLimitConfigType is the xDS type URL of envoyproxy/ratelimit's
// configuration resource, the one Envoy Gateway serves to its rate limit
// service.
const RateLimitConfigType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// FromRateLimitConfigs builds a Config from xDS RateLimitConfig resources.
// Each resource is one domain, read exactly as the YAML file of the same
// content would be: the same fields, defaults and checks, with every
// problem reported against the resource's name ("xds:NAME").
func FromRateLimitConfigs(cfgs ...*rlsconfv3.RateLimitConfig) (*Config, error) {
	files := make([]File, 0, len(cfgs))
	for _, c := range cfgs {
		data, err := yaml.Marshal(yamlRoot{Domain: c.GetDomain(), Descriptors: yamlDescriptors(c.GetDescriptors())})
		if err != nil {
			return nil, yamlconf.Errors{{File: "xds:" + c.GetName(), Msg: err.Error()}}
		}
		files = append(files, File{Name: "xds:" + c.GetName(), Data: data})
	}
	return Parse(files...)
}

// The YAML form of a RateLimitConfig: what FromRateLimitConfigs hands to
// the file parser. Unset fields are left out so that the parser's defaults
// apply, as they do to a file that leaves them out.
type (
	yamlRoot struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value,omitempty"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
		ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
		QuotaMode      bool             `yaml:"quota_mode,omitempty"`
		DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	}
	yamlRateLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit uint32        `yaml:"requests_per_unit"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

func yamlDescriptors(ds []*rlsconfv3.RateLimitDescriptor) []yamlDescriptor {
	out := make([]yamlDescriptor, 0, len(ds))
	for _, d := range ds {
		yd := yamlDescriptor{
			Key: d.GetKey(), Value: d.GetValue(), Descriptors: yamlDescriptors(d.GetDescriptors()),
			ShadowMode: d.GetShadowMode(), QuotaMode: d.GetQuotaMode(), DetailedMetric: d.GetDetailedMetric(),
		}
		if rl := d.GetRateLimit(); rl != nil {
			yd.RateLimit = &yamlRateLimit{RequestsPerUnit: rl.GetRequestsPerUnit(), Unlimited: rl.GetUnlimited(), Name: rl.GetName()}
			// UNKNOWN is the proto's zero: no unit, which an unlimited
			// limit must have and any other is refused for.
			if rl.GetUnit() != rlsconfv3.RateLimitUnit_UNKNOWN {
				yd.RateLimit.Unit = rl.GetUnit().String()
			}
			for _, r := range rl.GetReplaces() {
				yd.RateLimit.Replaces = append(yd.RateLimit.Replaces, yamlReplace{Name: r.GetName()})
			}
		}
		out = append(out, yd)
	}
	return out
}

// XDSOptions configure WatchXDS.
type XDSOptions struct {
	// Conn reaches the xDS management server (Envoy Gateway's rate limit
	// config server, for one).
	Conn grpc.ClientConnInterface
	// Node identifies this server to the management server; Envoy Gateway
	// answers the node ID "envoy-ratelimit".
	Node *corev3.Node
	// Apply is given each configuration received. An error refuses it: the
	// management server is told why (a NACK) and the running configuration
	// is kept.
	Apply func(*Config) error
	// Refused, if set, is told of each version refused (its
	// configuration could not be read, or Apply refused it).
	Refused func(version string, err error)
	// Logger, if set, is told of streams that end and configurations
	// applied or refused.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before a stream that ended
	// is opened again (defaults 500 ms and 30 s), doubled after each
	// failure, with jitter, and reset once a stream has delivered a
	// configuration.
	MinBackoff, MaxBackoff time.Duration
}

// WatchXDS follows envoyproxy/ratelimit's configuration over xDS, in the
// state-of-the-world protocol on the aggregated discovery service, as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW: every response
// carries the whole set of RateLimitConfig resources, which replaces the
// running configuration once it is read and applied without error (and is
// then acknowledged), or is refused whole. A stream that ends is opened
// again, with backoff, until ctx ends; WatchXDS then returns ctx's error.
func WatchXDS(ctx context.Context, o XDSOptions) error {
	if o.Conn == nil || o.Apply == nil {
		return errors.New("envoyrls: WatchXDS needs a connection and an Apply function")
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(30*time.Second, o.MinBackoff)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &xdsWatch{o: o, log: log}
	wait := o.MinBackoff
	for {
		delivered, err := w.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if delivered {
			wait = o.MinBackoff
		}
		log.Warn("xDS configuration stream ended; opening it again", "err", err, "after", wait)
		// Full jitter over the upper half, so that servers restarted
		// together do not reconnect together.
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, o.MaxBackoff)
	}
}

type xdsWatch struct {
	o   XDSOptions
	log *slog.Logger
	// version is the last version applied: a new stream asks from it, so
	// that a management server that has not changed need not resend.
	version string
	// refused is the last version refused, and refusals how many times in
	// a row: a snapshot server (go-control-plane's, Envoy Gateway's) sends
	// a refused version again as soon as it is refused, so a repeated
	// refusal waits, with backoff, rather than spin.
	refused  string
	refusals int
}

// stream runs one ADS stream until it fails; delivered reports whether it
// brought a response.
func (w *xdsWatch) stream(ctx context.Context) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(w.o.Conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	req := &discoveryv3.DiscoveryRequest{Node: w.o.Node, TypeUrl: RateLimitConfigType, VersionInfo: w.version}
	for {
		if err := s.Send(req); err != nil {
			return delivered, err
		}
		resp, err := s.Recv()
		if err != nil {
			return delivered, err
		}
		delivered = true
		// Later requests need not name the node again (the server keeps
		// the stream's), but a version and the nonce they answer.
		req = &discoveryv3.DiscoveryRequest{TypeUrl: RateLimitConfigType, ResponseNonce: resp.GetNonce(), VersionInfo: w.version}
		if resp.GetTypeUrl() != RateLimitConfigType {
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: fmt.Sprintf("type %q not asked for", resp.GetTypeUrl())}
			continue
		}
		if err := w.apply(resp); err != nil {
			if err := w.pause(ctx, resp.GetVersionInfo()); err != nil {
				return delivered, err
			}
			if w.o.Refused != nil {
				w.o.Refused(resp.GetVersionInfo(), err)
			}
			w.log.Error("xDS configuration refused; keeping the running one", "version", resp.GetVersionInfo(), "err", strings.ReplaceAll(err.Error(), "\n", "; "))
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			continue
		}
		w.version, w.refused, w.refusals = resp.GetVersionInfo(), "", 0
		req.VersionInfo = w.version
	}
}

// pause waits before a version refused again is refused once more: not at
// all the first time, then MinBackoff, doubled each time up to MaxBackoff.
func (w *xdsWatch) pause(ctx context.Context, version string) error {
	if version != w.refused {
		w.refused, w.refusals = version, 0
	}
	w.refusals++
	if w.refusals == 1 {
		return nil
	}
	wait := w.o.MinBackoff << min(w.refusals-2, 16)
	t := time.NewTimer(min(wait, w.o.MaxBackoff))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// apply reads every resource of resp and applies the configuration they
// make together.
func (w *xdsWatch) apply(resp *discoveryv3.DiscoveryResponse) error {
	cfgs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for _, res := range resp.GetResources() {
		c := &rlsconfv3.RateLimitConfig{}
		if err := res.UnmarshalTo(c); err != nil {
			return fmt.Errorf("resource %s: %w", res.GetTypeUrl(), err)
		}
		cfgs = append(cfgs, c)
	}
	// By name, so that the same set is the same configuration whatever
	// order the server sends it in (a domain's errors name its resource).
	sort.Slice(cfgs, func(i, j int) bool { return cfgs[i].GetName() < cfgs[j].GetName() })
	c, err := FromRateLimitConfigs(cfgs...)
	if err != nil {
		return err
	}
	if err := w.o.Apply(c); err != nil {
		return err
	}
	w.log.Info("xDS configuration applied", "version", resp.GetVersionInfo(), "domains", strings.Join(c.Domains(), ","))
	return nil
}
