package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/admitdev/admit/redistest"
)

const chart = "../deploy/helm/admit"

// helm runs the helm the e2e module pins as a tool (go.mod's tool
// directive): built from the Go module proxy, nothing else to install.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"tool", "helm"}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %v: %s%s", args[0], err, stderr.String(), out.String())
	}
	return out.String(), nil
}

// rendered is what `helm template` made of one values file, every object
// decoded strictly into its Kubernetes API type.
type rendered struct {
	deployment      *appsv1.Deployment
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	serviceAccounts []*corev1.ServiceAccount
	hpa             *autoscalingv2.HorizontalPodAutoscaler
	pdb             *policyv1.PodDisruptionBudget
	networkPolicy   *networkingv1.NetworkPolicy
	serviceMonitor  *monitoringv1.ServiceMonitor
}

// render runs helm template (Kubernetes 1.31) and decodes each object. An
// unknown field, a wrong type or a kind the chart should not make fails.
func render(t *testing.T, args ...string) *rendered {
	t.Helper()
	out, err := helm(t, append([]string{"template", "admit", chart, "--namespace", "edge", "--kube-version", "1.31.0"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for doc := range strings.SplitSeq(out, "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			if r.deployment != nil {
				t.Fatal("two Deployments")
			}
			r.deployment = &appsv1.Deployment{}
			obj = r.deployment
		case "v1 Service":
			obj = &corev1.Service{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "autoscaling/v2 HorizontalPodAutoscaler":
			r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			obj = r.hpa
		case "policy/v1 PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			obj = r.pdb
		case "networking.k8s.io/v1 NetworkPolicy":
			r.networkPolicy = &networkingv1.NetworkPolicy{}
			obj = r.networkPolicy
		case "monitoring.coreos.com/v1 ServiceMonitor":
			r.serviceMonitor = &monitoringv1.ServiceMonitor{}
			obj = r.serviceMonitor
		default:
			t.Fatalf("the chart made a %s %s, which this test does not know", head.APIVersion, head.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s does not decode strictly: %v\n%s", head.APIVersion, head.Kind, err, doc)
		}
		switch o := obj.(type) {
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Secret:
			r.secrets[o.Name] = o
		case *corev1.ServiceAccount:
			r.serviceAccounts = append(r.serviceAccounts, o)
		}
	}
	if r.deployment == nil {
		t.Fatal("no Deployment")
	}
	return r
}

// container is the Deployment's one container.
func (r *rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	if n := len(r.deployment.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers", n)
	}
	return r.deployment.Spec.Template.Spec.Containers[0]
}

// config is the configuration file the pods read.
func (r *rendered) config(t *testing.T) string {
	t.Helper()
	cm := r.configMaps[r.deployment.Name]
	if cm == nil || cm.Data["admit.yaml"] == "" {
		t.Fatalf("no admit.yaml ConfigMap among %v", slices.Collect(mapsKeys(r.configMaps)))
	}
	return cm.Data["admit.yaml"]
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// checkObjects checks what must hold for every values file: the objects
// point at each other correctly and the pods run as Admit needs.
func checkObjects(t *testing.T, r *rendered) {
	t.Helper()
	pod := r.deployment.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(r.deployment.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", sel, pod.Labels)
	}
	c := r.container(t)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, svc := range r.services {
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			t.Errorf("Service %s selects %v, not the pods", name, svc.Spec.Selector)
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service %s targets port %q, which the container does not name", name, p.TargetPort.String())
			}
		}
	}
	for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if probe == nil || probe.HTTPGet == nil || ports[probe.HTTPGet.Port.StrVal] == 0 {
			t.Errorf("probe %+v does not ask a named container port", probe)
		}
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes ask %s and %s", c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path)
	}
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("the pod may run as root: %+v", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container security context %+v", sc)
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" {
			t.Errorf("volume %s is mounted with subPath: the kubelet would never update it", m.Name)
		}
	}
	if grace, stop := pod.Spec.TerminationGracePeriodSeconds, c.Lifecycle; grace == nil ||
		(stop != nil && stop.PreStop.Sleep != nil && *grace < stop.PreStop.Sleep.Seconds+10) {
		t.Errorf("grace period %v does not cover the preStop pause and the 10 s drain", grace)
	}
	for _, e := range c.Env {
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			if s, ok := r.secrets[ref.SecretKeyRef.Name]; ok && s.Data[ref.SecretKeyRef.Key] == nil {
				t.Errorf("env %s names key %s, which Secret %s lacks", e.Name, ref.SecretKeyRef.Key, s.Name)
			}
		}
	}
	if r.pdb != nil {
		s, err := metav1.LabelSelectorAsSelector(r.pdb.Spec.Selector)
		if err != nil || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("the PodDisruptionBudget does not select the pods: %v", err)
		}
	}
	if r.hpa != nil && (r.hpa.Spec.ScaleTargetRef.Name != r.deployment.Name || r.deployment.Spec.Replicas != nil) {
		t.Errorf("the HPA scales %q; the Deployment fixes replicas %v", r.hpa.Spec.ScaleTargetRef.Name, r.deployment.Spec.Replicas)
	}
	// Metrics have a port of their own, behind a ClusterIP Service of its
	// own, which the ServiceMonitor alone selects: the HTTP port, which
	// tenants reach, serves none (admit serve --metrics).
	metrics := r.services[r.deployment.Name+"-metrics"]
	if !strings.Contains(strings.Join(c.Args, " "), "--metrics=:9090") || ports["metrics"] != 9090 ||
		metrics == nil || metrics.Spec.Type != corev1.ServiceTypeClusterIP || metrics.Spec.Ports[0].Name != "metrics" {
		t.Errorf("no metrics port of its own: args %v, ports %v, Service %v", c.Args, ports, metrics)
	}
	for name, svc := range r.services {
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.StrVal == "metrics" && svc != metrics {
				t.Errorf("Service %s publishes the metrics port", name)
			}
		}
	}
	if r.serviceMonitor != nil {
		sel, err := metav1.LabelSelectorAsSelector(&r.serviceMonitor.Spec.Selector)
		if err != nil || len(r.serviceMonitor.Spec.Endpoints) != 1 || r.serviceMonitor.Spec.Endpoints[0].Port != "metrics" {
			t.Errorf("the ServiceMonitor scrapes %+v (%v)", r.serviceMonitor.Spec.Endpoints, err)
		}
		for name, svc := range r.services {
			if sel.Matches(labels.Set(svc.Labels)) != (svc == metrics) {
				t.Errorf("the ServiceMonitor's selector %v and Service %s", sel, name)
			}
		}
	}
}

// TestHelmChart lints the chart and renders it for each values file in
// ci/, then checks the objects and that Admit accepts the configuration.
func TestHelmChart(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chart, "ci", "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("values files: %v %v", files, err)
	}
	if out, err := helm(t, "lint", "--strict", chart); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	type want struct {
		replicas, instances int
		redis, hpa, pdb     bool
		region              bool
		objects             int
	}
	wants := map[string]want{
		"memory-values.yaml":       {replicas: 1, instances: 1, objects: 7},
		"redis-values.yaml":        {replicas: 3, instances: 3, redis: true, pdb: true, objects: 12},
		"sentinel-hpa-values.yaml": {instances: 8, redis: true, hpa: true, pdb: true, objects: 8},
		"cluster-values.yaml":      {replicas: 2, instances: 2, redis: true, objects: 8},
		"region-values.yaml":       {replicas: 2, instances: 2, redis: true, region: true, pdb: true, objects: 10},
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			w, ok := wants[name]
			if !ok {
				t.Fatalf("no expectations for %s", name)
			}
			if out, err := helm(t, "lint", "--strict", chart, "-f", f); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r := render(t, "-f", f)
			checkObjects(t, r)
			n := len(r.services) + len(r.configMaps) + len(r.secrets) + len(r.serviceAccounts) + 1
			for _, present := range []bool{r.hpa != nil, r.pdb != nil, r.networkPolicy != nil, r.serviceMonitor != nil} {
				if present {
					n++
				}
			}
			if n != w.objects {
				t.Errorf("%d objects, want %d", n, w.objects)
			}
			if got := r.deployment.Spec.Replicas; w.hpa != (got == nil) || (got != nil && int(*got) != w.replicas) {
				t.Errorf("replicas %v, want %d", got, w.replicas)
			}
			if (r.hpa != nil) != w.hpa || (r.pdb != nil) != w.pdb {
				t.Errorf("HPA %v, PDB %v", r.hpa != nil, r.pdb != nil)
			}
			args := strings.Join(r.container(t).Args, " ")
			if strings.Contains(args, "--store=$(ADMIT_STORE)") != w.redis {
				t.Errorf("args %s: redis %v", args, w.redis)
			}
			if strings.Contains(args, "--region=eu --home=$(ADMIT_HOME)") != w.region {
				t.Errorf("args %s: region %v", args, w.region)
			}
			if want := fmt.Sprintf("\n  instances: %d\n", w.instances); !strings.Contains(r.config(t), want) {
				t.Errorf("store.instances is not %d:\n%s", w.instances, r.config(t))
			}
			validateConfig(t, r)
		})
	}
}

// validateConfig runs `admit config validate` on the rendered files.
func validateConfig(t *testing.T, r *rendered) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "admit.yaml")
	if err := os.WriteFile(file, []byte(r.config(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(admitBinary(t), "config", "validate", file).CombinedOutput(); err != nil {
		t.Errorf("admit config validate: %v\n%s", err, out)
	}
}

// TestHelmChartRefusesWhatCannotWork renders values that would deploy a
// broken service and expects helm to say why.
func TestHelmChartRefusesWhatCannotWork(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"replicaCount=2"}, "more than one pod needs redis.url"},
		{[]string{"autoscaling.enabled=true"}, "more than one pod needs redis.url"},
		{[]string{"redis.url=redis://r:6379", "autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=3"}, "maxReplicas is less than"},
		{[]string{"preStopSleepSeconds=25"}, "must cover preStopSleepSeconds"},
		{[]string{"envoyConfig.edge\\.yml=x"}, "file names end in .yaml"},
		{[]string{"redis.url=redis://r:6379", "region.home.url=redis://home:6379"}, "region.home needs region.name"},
		{[]string{"region.name=eu", "region.home.url=redis://home:6379"}, "region.home needs redis.url"},
		{[]string{"redis.url=redis://r:6379", "region.name=eu"}, "region.name needs region.home.url"},
	} {
		args := []string{"template", "admit", chart}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		if out, err := helm(t, args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %v: want an error saying %q, got %v\n%s", c.set, c.want, err, out)
		}
	}
}

// TestHelmChartRuns runs admit serve the way the rendered Deployment runs
// it: its arguments and environment (Secrets resolved), the ConfigMaps laid
// out as the kubelet lays out a volume, a real Redis. It checks the probes,
// the admin token, the Envoy file, and that a changed ConfigMap, swapped in
// as the kubelet swaps it, is reloaded without a restart.
func TestHelmChartRuns(t *testing.T) {
	redis := redistest.Start(t)
	values := []string{"-f", filepath.Join(chart, "ci", "redis-values.yaml"), "--set", "redis.url=redis://" + redis.Addr}
	r := render(t, values...)
	c := r.container(t)
	root := t.TempDir()
	config := mountConfigMap(t, filepath.Join(root, "config"), r.configMaps[r.deployment.Name].Data)
	// admit serve exits at start when an --envoy-config file is invalid.
	envoy := mountConfigMap(t, filepath.Join(root, "envoy-config"), r.configMaps[r.deployment.Name+"-envoy"].Data)

	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := r.secrets[ref.Name]
			if s == nil {
				t.Fatalf("env %s: no Secret %s", e.Name, ref.Name)
			}
			env[e.Name] = string(s.Data[ref.Key])
		case e.ValueFrom.ResourceFieldRef != nil:
			q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]
			env[e.Name] = strconv.FormatInt(q.Value(), 10)
		}
	}
	var args []string
	vars := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, a := range c.Args {
		a = vars.ReplaceAllStringFunc(a, func(v string) string { return env[v[2:len(v)-1]] })
		a = strings.Replace(a, "=/config/", "="+config.dir+"/", 1)
		a = strings.Replace(a, "=/envoy-config", "="+envoy.dir, 1)
		if strings.HasPrefix(a, "--http=") || strings.HasPrefix(a, "--grpc=") || strings.HasPrefix(a, "--metrics=") {
			a = a[:strings.IndexByte(a, '=')+1] + "127.0.0.1:0"
		}
		args = append(args, a)
	}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	if env["ADMIT_ADMIN_TOKEN"] == "" || env["ADMIT_STORE"] != "redis://"+redis.Addr || env["GOMEMLIMIT"] != "536870912" {
		t.Fatalf("environment %v", env)
	}
	p := startAdmitEnv(t, environ, args...)

	for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		resp, err := http.Get(p.url + probe.HTTPGet.Path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("probe %s: %v %v", probe.HTTPGet.Path, resp, err)
		}
		resp.Body.Close()
	}
	ask := func(method, path, token, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	if code, m := ask("GET", "/readyz", "", ""); code != 200 || m["store"] != "ok" {
		t.Errorf("/readyz %d %v", code, m)
	}
	// The admin API answers the Secret's token, and only it (the test's
	// client is on loopback, which a server without a token would trust).
	if code, _ := ask("GET", "/v1/admin/tenants", "", ""); code != 401 {
		t.Errorf("admin API without the token: %d", code)
	}
	if code, _ := ask("GET", "/v1/admin/tenants/acme", env["ADMIT_ADMIN_TOKEN"], ""); code != 200 {
		t.Errorf("admin API with the Secret's token: %d", code)
	}
	limit := func() float64 {
		code, m := ask("POST", "/v1/check", "", `{"tenant":"acme","cost":0}`)
		if code != 200 {
			t.Fatalf("check: %d %v", code, m)
		}
		return m["limit"].(float64)
	}
	if got := limit(); got != 3 {
		t.Fatalf("limit %v, want the values' burst 3", got)
	}

	// helm upgrade with a new burst: the kubelet swaps the volume's data.
	r2 := render(t, append(values, "--set", "config.tiers.free.rules[0].burst=7")...)
	config2 := r2.configMaps[r2.deployment.Name].Data
	if config2["admit.yaml"] == r.configMaps[r.deployment.Name].Data["admit.yaml"] {
		t.Fatal("the upgrade did not change the ConfigMap")
	}
	if r2.deployment.Spec.Template.Annotations["checksum/secret"] == "" {
		t.Error("no checksum/secret annotation")
	}
	config.swap(t, config2)
	deadline := time.Now().Add(15 * time.Second)
	for limit() != 7 {
		if time.Now().After(deadline) {
			t.Fatal("the changed ConfigMap was not reloaded")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A broken file is refused and the running configuration kept.
	config.swap(t, map[string]string{"admit.yaml": "version: 1\nglobal: {\n"})
	deadline = time.Now().Add(15 * time.Second)
	for {
		code, m := ask("GET", "/readyz", "", "")
		if e, _ := m["config_error"].(string); e != "" {
			if code != 200 {
				t.Errorf("/readyz %d while serving the previous configuration", code)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the broken ConfigMap was not reported")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := limit(); got != 7 {
		t.Errorf("after a broken ConfigMap the limit is %v, want the running 7", got)
	}
}

// configVolume is a directory laid out as the kubelet lays out a ConfigMap
// volume: each file a symlink through ..data to a timestamped directory,
// and an update a new directory swapped in by renaming ..data.
type configVolume struct {
	dir string
	n   int
}

func mountConfigMap(t *testing.T, dir string, data map[string]string) *configVolume {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v := &configVolume{dir: dir}
	v.swap(t, data)
	return v
}

func (v *configVolume) swap(t *testing.T, data map[string]string) {
	t.Helper()
	if v.n == 0 {
		entries, _ := os.ReadDir(v.dir)
		v.n = len(entries) + 1
	} else {
		v.n++
	}
	ts := fmt.Sprintf("..2026_11_23_00_00_%02d.%d", v.n, os.Getpid())
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range data {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range data {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(v.dir, old))
	}
}
