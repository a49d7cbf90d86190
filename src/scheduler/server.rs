//! The extender's HTTP side: `POST /filter`, `/prioritize`, `/bind` (kube-scheduler's extender
//! protocol), `GET /healthz`, `/metrics` (Prometheus text) and `/allocations` (JSON).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;

use super::cache::{Cluster, FILTER_REASONS, ReserveError, Reserved};
use super::wire::{
    ExtenderArgs, ExtenderArgsRef, ExtenderBindingArgs, ExtenderBindingResult,
    ExtenderFilterResult, FilterAnswer, HostPriority, MAX_BODY, Priorities, WireError,
};
use crate::kubeobjects::{PodKey, pod_key};
use crate::metrics::{Kind, PromText};
use gpushare_core::echo::{Echo, cut_message};
use gpushare_core::request::ASSIGNMENT_ANNOTATION;
use gpushare_core::request::node::{
    ACK_GPU_MEM_ASSIGNED, ACK_GPU_MEM_ASSUME_TIME, ACK_GPU_MEM_DEV, ACK_GPU_MEM_IDX,
    ACK_GPU_MEM_POD,
};

/// A boxed cause (the API client's error, or a stand-in's).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A pod key as messages show it: cut (a bind request names the pod; names may be 253 bytes).
fn shown(pod: &PodKey) -> Echo {
    Echo::new(&pod.to_string())
}

/// A fault: the API server did not do what bind asked (the pod may well fit).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot read pod {:#}: {}", shown(pod), cut_message(&source.to_string(), 200))]
    GetPod { pod: PodKey, source: Cause },
    /// The API server says the pod does not exist (deleted, e.g. while kube-scheduler placed
    /// it): nothing can be bound for it, so nothing need be held.
    #[error("pod {:#} does not exist (deleted)", shown(pod))]
    PodGone { pod: PodKey },
    #[error(
        "cannot bind pod {:#} to {:#}: {}",
        shown(pod),
        Echo::new(node),
        cut_message(&source.to_string(), 200)
    )]
    Bind {
        pod: PodKey,
        node: String,
        source: Cause,
    },
}

/// A refusal: this pod cannot be bound to this node (retrying the same request will not help
/// until something changes).
#[derive(Debug, thiserror::Error)]
pub enum BindRefusal {
    #[error("pod {pod:#} has UID {uid:#}, the bind request names {requested:#}")]
    UidMismatch {
        pod: Echo,
        uid: Echo,
        requested: Echo,
    },
    #[error("pod {pod:#} is already bound to {node:#}")]
    AlreadyBound { pod: Echo, node: Echo },
    #[error("pod {pod:#} has schedulerName {name}; this extender binds pods of {served} only")]
    OtherScheduler { pod: Echo, name: Echo, served: Echo },
    #[error("bind: {field} {value} is not a valid Kubernetes name")]
    BadName {
        field: &'static str,
        value: gpushare_core::echo::Echo,
    },
    #[error("pod {pod:#}: a bind for it is already in progress")]
    InProgress { pod: Echo },
    #[error("gpushare scheduler: cache not synced with the API server yet")]
    NotSynced,
    #[error(transparent)]
    Request(#[from] WireError),
    #[error(transparent)]
    Reserve(#[from] ReserveError),
}

/// Why `bind` did not bind: a refusal or a fault. Both reach kube-scheduler the same way (the
/// `Error` of the bind answer, HTTP 200: the extender protocol has no other channel); the
/// types keep them apart for logs and callers.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(transparent)]
    Refused(#[from] BindRefusal),
    #[error(transparent)]
    Fault(#[from] ApiError),
}

impl From<ReserveError> for BindError {
    fn from(e: ReserveError) -> Self {
        BindError::Refused(e.into())
    }
}

impl BindError {
    pub fn is_fault(&self) -> bool {
        matches!(self, BindError::Fault(_))
    }
}

impl From<BindError> for ExtenderBindingResult {
    fn from(e: BindError) -> Self {
        ExtenderBindingResult {
            error: e.to_string(),
        }
    }
}

/// Why `filter` answers with an error instead of nodes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// A refusal: the request is malformed.
    #[error("filter: the request carries no Pod")]
    NoPod,
    /// A fault: we cannot decide yet (kube-scheduler retries).
    #[error("gpushare scheduler: cache not synced with the API server yet")]
    NotSynced,
}

impl From<FilterError> for ExtenderFilterResult {
    fn from(e: FilterError) -> Self {
        ExtenderFilterResult {
            error: e.to_string(),
            ..Default::default()
        }
    }
}

/// What `bind` needs from the API server (a trait so the benchmark and tests can run the
/// extender without one).
#[async_trait]
pub trait Binder: Send + Sync {
    async fn get_pod(&self, pod: &PodKey) -> Result<Pod, ApiError>;
    /// Creates the pod's Binding to `node` (for the pod of UID `uid`, when not empty) with
    /// `annotations`: the API server sets the pod's node and copies the Binding's
    /// annotations onto it in one update, so a pod is never bound without its assignment nor
    /// annotated without being bound.
    async fn bind(
        &self,
        pod: &PodKey,
        uid: &str,
        node: &str,
        annotations: &Annotations,
    ) -> Result<(), ApiError>;
}

/// Annotations a Binding carries onto its pod.
pub type Annotations = BTreeMap<String, String>;

/// How many pods filter has seen are kept for their bind ([`Extender::bind`] reads the pod
/// from here instead of the API server).
const FILTERED_PODS: usize = 512;

/// The pods of recent filters, by UID, oldest first out.
#[derive(Default)]
struct FilteredPods {
    order: std::collections::VecDeque<String>,
    pods: HashMap<String, Pod>,
}

impl FilteredPods {
    fn remember(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
            return;
        };
        if self.pods.insert(uid.clone(), pod).is_none() {
            self.order.push_back(uid);
            while self.order.len() > FILTERED_PODS {
                if let Some(old) = self.order.pop_front() {
                    self.pods.remove(&old);
                }
            }
        }
    }

    /// The pod of UID `uid` if filter saw it under `key`'s namespace and name.
    fn take(&mut self, uid: &str, key: &PodKey) -> Option<Pod> {
        let p = self.pods.get(uid)?;
        if p.metadata.namespace.as_deref() != Some(&key.namespace)
            || p.metadata.name.as_deref() != Some(&key.name)
        {
            return None;
        }
        self.order.retain(|u| u != uid);
        self.pods.remove(uid)
    }
}

/// Latency histogram (seconds) with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; 8],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

const BUCKETS_S: [f64; 8] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 1.0];

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: Default::default(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, since: Instant) {
        let s = since.elapsed().as_secs_f64();
        for (b, le) in self.buckets.iter().zip(BUCKETS_S) {
            if s <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add((s * 1e9) as u64, Ordering::Relaxed);
    }

    /// Its `_bucket`, `_sum` and `_count` samples, with `labels`.
    fn write(&self, m: &mut PromText, name: &str, labels: &[(&str, &str)]) {
        let bucket = format!("{name}_bucket");
        let les = BUCKETS_S.iter().map(|le| le.to_string());
        let counts = self.buckets.iter().map(|b| b.load(Ordering::Relaxed));
        let count = self.count.load(Ordering::Relaxed);
        for (le, n) in les.chain(["+Inf".into()]).zip(counts.chain([count])) {
            let l: Vec<(&str, &str)> = labels.iter().copied().chain([("le", &*le)]).collect();
            m.sample_of(&bucket, &l, n);
        }
        m.sample_of(
            &format!("{name}_sum"),
            labels,
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        );
        m.sample_of(&format!("{name}_count"), labels, count);
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub filter: Histogram,
    pub prioritize: Histogram,
    pub bind: Histogram,
    pub binds_ok: AtomicU64,
    pub binds_failed: AtomicU64,
    pub assumed_expired: AtomicU64,
    /// Binds that read their pod from the API server (not among the pods filter saw).
    pub bind_pod_reads: AtomicU64,
    pub watch_restarts: AtomicU64,
    /// Objects the node and pod watches delivered (listed, changed or deleted).
    pub node_events: AtomicU64,
    pub pod_events: AtomicU64,
    /// Nodes ruled out by `filter`, by reason ([`FILTER_REASONS`], same order).
    pub filter_rejections: [AtomicU64; FILTER_REASONS.len()],
}

/// Nodes the warmer scores per hold of the cluster: a quarter of a millisecond at most that a
/// filter may wait for it.
pub const WARM_SLICE: usize = 256;

/// How often the warmer looks for stale scores once it found none.
pub const WARM_IDLE: std::time::Duration = std::time::Duration::from_millis(100);

/// Shared by the handlers and the watch loop.
pub struct Extender {
    pub cluster: Mutex<Cluster>,
    pub binder: Arc<dyn Binder>,
    pub metrics: Metrics,
    /// Both watches listed once (until then filter answers with an error).
    pub synced_nodes: AtomicBool,
    pub synced_pods: AtomicBool,
    /// Only pods with one of these `schedulerName`s are bound.
    scheduler_names: Vec<String>,
    /// Pods (namespace/name) with a bind under way: one bind per pod at a time.
    binding: Mutex<std::collections::HashSet<String>>,
    /// The pods filter saw, for their bind.
    filtered: Mutex<FilteredPods>,
}

/// Removes a pod from the in-progress set when its bind ends, however it ends.
struct BindSlot<'a>(&'a Extender, String);

impl Drop for BindSlot<'_> {
    fn drop(&mut self) {
        self.0
            .binding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// A DNS-1123 subdomain (object and node names): at most 253 characters of lowercase
/// alphanumerics, '-' and '.', starting and ending alphanumeric.
pub fn is_dns_subdomain(s: &str) -> bool {
    let an = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|c| an(c) || c == b'-' || c == b'.')
        && an(s.as_bytes()[0])
        && an(s.as_bytes()[s.len() - 1])
}

/// A DNS-1123 label (namespaces): a subdomain of at most 63 characters without '.'.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

impl Extender {
    pub fn new(cluster: Cluster, binder: Arc<dyn Binder>) -> Self {
        Extender {
            cluster: Mutex::new(cluster),
            binder,
            metrics: Metrics::default(),
            synced_nodes: AtomicBool::new(false),
            synced_pods: AtomicBool::new(false),
            scheduler_names: vec!["default-scheduler".into(), "gpushare-scheduler".into()],
            binding: Mutex::new(Default::default()),
            filtered: Mutex::new(Default::default()),
        }
    }

    /// Binds only pods whose `schedulerName` is one of `names`.
    pub fn with_scheduler_names(mut self, names: Vec<String>) -> Self {
        self.scheduler_names = names;
        self
    }

    pub fn synced(&self) -> bool {
        self.synced_nodes.load(Ordering::Acquire) && self.synced_pods.load(Ordering::Acquire)
    }

    /// [`Cluster::set_filter_best`].
    pub fn set_filter_best(&self, n: usize) {
        self.lock().set_filter_best(n);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs forever: keeps the frequent request shapes of the recent pods scored on every
    /// node ([`Cluster::warm_step`]), [`WARM_SLICE`] nodes at a time and only when no filter,
    /// bind or watch event holds the cluster, so that their filters read cached scores. Once
    /// every such score is current it looks again every [`WARM_IDLE`].
    pub async fn warm(self: Arc<Self>) {
        loop {
            if !self.synced() {
                tokio::time::sleep(WARM_IDLE).await;
                continue;
            }
            let step = match self.cluster.try_lock() {
                Ok(mut c) => Some(c.warm_step(WARM_SLICE)),
                Err(std::sync::TryLockError::Poisoned(e)) => {
                    Some(e.into_inner().warm_step(WARM_SLICE))
                }
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            let Some(more) = step else {
                // Someone else's turn (a filter, a bind, a rebuild): no spinning beside it.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            };
            if more {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(WARM_IDLE).await;
            }
        }
    }

    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let t = Instant::now();
        let names = candidate_names(args);
        let out = self.filter_names(args.pod.as_ref(), &names).into_owned();
        self.metrics.filter.observe(t);
        if let Some(pod) = &args.pod
            && out.node_names.as_ref().is_some_and(|n| !n.is_empty())
        {
            self.remember_filtered(pod.clone());
        }
        out
    }

    /// Keeps a pod that filter passed for its bind (kube-scheduler sends the bind only the
    /// pod's name and UID).
    fn remember_filtered(&self, pod: Pod) {
        self.filtered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(pod);
    }

    /// The pod a bind is for: as filter saw it when the UIDs match (its spec cannot have
    /// changed since: a pod's containers' resources, scheduler name and UID are fixed until
    /// it is bound, and the Binding itself is refused if it was bound or replaced
    /// meanwhile), else read from the API server.
    ///
    /// Read from the API server also when the cache already holds the pod: an earlier bind
    /// of it went through (its answer lost, or later than kube-scheduler waited) or the watch
    /// saw it bound. Filter's copy is from before that; the API server says whether it is
    /// bound, before anything held for it is given back.
    async fn pod_to_bind(&self, key: &PodKey, uid: &str) -> Result<Pod, ApiError> {
        if !uid.is_empty()
            && let Some(p) = self
                .filtered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(uid, key)
            && !self.lock().holds(uid)
        {
            return Ok(p);
        }
        self.metrics.bind_pod_reads.fetch_add(1, Ordering::Relaxed);
        self.binder.get_pod(key).await
    }

    /// `filter` of `pod` among `names`, the answer borrowing the names.
    fn filter_names<'a, N: AsRef<str>>(
        &self,
        pod: Option<&Pod>,
        names: &'a [N],
    ) -> FilterAnswer<'a> {
        let error = match pod {
            None => FilterError::NoPod,
            Some(_) if !self.synced() => FilterError::NotSynced,
            Some(pod) => {
                return self.lock().filter_answer(pod, names, &mut |reason| {
                    self.metrics.filter_rejections[reason].fetch_add(1, Ordering::Relaxed);
                });
            }
        };
        FilterAnswer {
            error: error.to_string(),
            ..Default::default()
        }
    }

    pub fn prioritize(&self, args: &ExtenderArgs) -> Vec<HostPriority> {
        let t = Instant::now();
        let names = candidate_names(args);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let out = self.prioritize_names(args.pod.as_ref(), names).into_owned();
        self.metrics.prioritize.observe(t);
        out
    }

    /// `prioritize` of `pod` among `names`.
    fn prioritize_names<'a>(&self, pod: Option<&Pod>, names: Vec<&'a str>) -> Priorities<'a> {
        match pod {
            Some(pod) => Priorities {
                scores: self.lock().priorities(pod, &names),
                hosts: names,
            },
            None => Priorities {
                hosts: Vec::new(),
                scores: Vec::new(),
            },
        }
    }

    /// Reserves the GPUs, writes the assignment, binds; on any failure gives the GPUs back.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        let t = Instant::now();
        let r = self.bind_inner(args).await;
        self.metrics.bind.observe(t);
        match r {
            Ok(()) => {
                self.metrics.binds_ok.fetch_add(1, Ordering::Relaxed);
                ExtenderBindingResult::default()
            }
            Err(e) => {
                self.metrics.binds_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, fault = e.is_fault(), "bind failed: {e}");
                e.into()
            }
        }
    }

    async fn bind_inner(&self, args: &ExtenderBindingArgs) -> Result<(), BindError> {
        // Names that cannot be Kubernetes names are refused before they reach the API server
        // or a message.
        args.check().map_err(BindRefusal::from)?;
        for (field, value, ok) in [
            (
                "PodNamespace",
                &args.pod_namespace,
                is_dns_label(&args.pod_namespace),
            ),
            ("PodName", &args.pod_name, is_dns_subdomain(&args.pod_name)),
            ("Node", &args.node, is_dns_subdomain(&args.node)),
        ] {
            if !ok {
                return Err(BindRefusal::BadName {
                    field,
                    value: gpushare_core::echo::Echo::new(value),
                }
                .into());
            }
        }
        if !self.synced() {
            return Err(BindRefusal::NotSynced.into());
        }
        let key = PodKey {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
        };
        // One bind per pod at a time: a second one must not drop the first's reservation
        // or clear the annotations of a pod the first has bound.
        let slot = key.to_string();
        if !self
            .binding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(slot.clone())
        {
            return Err(BindRefusal::InProgress {
                pod: Echo::new(&slot),
            }
            .into());
        }
        let _slot = BindSlot(self, slot);
        let node = &args.node;
        let pod = self.pod_to_bind(&key, &args.pod_uid).await?;
        let scheduler = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.clone())
            .unwrap_or_else(|| "default-scheduler".into());
        if !self.scheduler_names.contains(&scheduler) {
            return Err(BindRefusal::OtherScheduler {
                pod: Echo::new(&key.to_string()),
                name: Echo::new(&scheduler),
                served: Echo::new(&self.scheduler_names.join(", ")),
            }
            .into());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !args.pod_uid.is_empty() && uid != args.pod_uid {
            return Err(BindRefusal::UidMismatch {
                pod: shown(&key),
                uid: Echo::new(&uid),
                requested: Echo::new(&args.pod_uid),
            }
            .into());
        }
        if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            // What the pod holds is what it carries, as the watch will say.
            self.lock().observe_pod(&pod);
            return Err(BindRefusal::AlreadyBound {
                pod: shown(&key),
                node: Echo::new(bound),
            }
            .into());
        }
        let (ann, gpus) = {
            let mut c = self.lock();
            match c.reserve(&pod, node, now_rfc3339()) {
                // Not a GPU pod (an extender configured without `managedResources` is asked
                // to bind every pod): bound as it is, its CPU and memory held on the node.
                Err(ReserveError::NoGpu { .. }) => {
                    c.assume_host(&pod, node);
                    (Annotations::new(), Vec::new())
                }
                r => {
                    let r = r?;
                    (binding_annotations(&c, node, &r), r.allocation.gpus)
                }
            }
        };
        // One API call: the Binding carries the annotations (nothing is written if it fails).
        if let Err(e) = self.binder.bind(&key, &uid, node, &ann).await {
            // What the pod holds now is what it carries: bound after all (by an earlier
            // attempt whose answer was lost, or by someone else), the cache takes its
            // assignment, if any, from the pod as the watch would; else nothing.
            let now = match self.binder.get_pod(&key).await {
                Ok(now) => Some(now),
                // Deleted (kube-scheduler placed a pod being deleted): a pod that does not
                // exist holds nothing, bound before or not; its reservation is given back now,
                // not when it expires (the watch never reports an unbound pod's deletion).
                Err(ApiError::PodGone { .. }) => None,
                Err(_) => {
                    // Bound or not is unknown: what was reserved stays held (the watch tells,
                    // or the reservation expires), rather than a bound pod's GPUs given away.
                    tracing::warn!(pod = %key, "bind failed and the pod cannot be read: its reservation stays until the watch shows the pod or it expires");
                    return Err(e.into());
                }
            };
            let mut c = self.lock();
            c.forget_pod(&uid);
            if let Some(now) = now.filter(|p| {
                p.metadata.uid.as_deref() == Some(&uid)
                    && p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some()
            }) {
                c.observe_pod(&now);
                tracing::warn!(pod = %key, "bind failed but the pod is bound: the cache holds what it carries");
            }
            return Err(e.into());
        }
        tracing::info!(
            pod = %pod_key(&pod), node = %node, gpus = ?gpus,
            "bound"
        );
        Ok(())
    }

    /// `filter` on a raw body: what the HTTP handler answers (a body that cannot be decoded
    /// is answered with its error).
    pub fn filter_body(&self, body: &[u8]) -> ExtenderFilterResult {
        self.filter_body_with(body, |a| a.into_owned())
    }

    /// [`Extender::filter_body`], the answer as JSON (what the HTTP handler sends).
    pub fn filter_body_json(&self, body: &[u8]) -> Vec<u8> {
        self.filter_body_with(body, |a| {
            serde_json::to_vec(&a).expect("a filter answer serializes")
        })
    }

    fn filter_body_with<T>(&self, body: &[u8], out: impl FnOnce(FilterAnswer<'_>) -> T) -> T {
        match ExtenderArgsRef::decode("filter", body) {
            Ok(mut args) => {
                let t = Instant::now();
                let pod = args.pod.take();
                let names = args.candidates();
                let a = self.filter_names(pod.as_ref(), &names);
                let passed = a.node_names.as_ref().is_some_and(|n| !n.is_empty());
                self.metrics.filter.observe(t);
                let answer = out(a);
                if let Some(pod) = pod.filter(|_| passed) {
                    self.remember_filtered(pod);
                }
                answer
            }
            Err(e) => out(FilterAnswer {
                error: e.to_string(),
                ..Default::default()
            }),
        }
    }

    /// `prioritize` on a raw body.
    pub fn prioritize_body(&self, body: &[u8]) -> Result<Vec<HostPriority>, WireError> {
        self.prioritize_body_with(body, |p| p.into_owned())
    }

    /// [`Extender::prioritize_body`], the answer as JSON (what the HTTP handler sends).
    pub fn prioritize_body_json(&self, body: &[u8]) -> Result<Vec<u8>, WireError> {
        self.prioritize_body_with(body, |p| {
            serde_json::to_vec(&p).expect("priorities serialize")
        })
    }

    fn prioritize_body_with<T>(
        &self,
        body: &[u8],
        out: impl FnOnce(Priorities<'_>) -> T,
    ) -> Result<T, WireError> {
        let args = ExtenderArgsRef::decode("prioritize", body)?;
        let t = Instant::now();
        let p = self.prioritize_names(args.pod.as_ref(), args.candidates());
        self.metrics.prioritize.observe(t);
        Ok(out(p))
    }

    pub fn metrics_text(&self) -> String {
        let mut out = PromText::new();
        let m = &self.metrics;
        let latency = "gpushare_extender_request_seconds";
        out.family(latency, Kind::Histogram);
        for (verb, h) in [
            ("filter", &m.filter),
            ("prioritize", &m.prioritize),
            ("bind", &m.bind),
        ] {
            h.write(&mut out, latency, &[("verb", verb)]);
        }
        out.family("gpushare_extender_binds_total", Kind::Counter)
            .sample(&[("result", "ok")], m.binds_ok.load(Ordering::Relaxed))
            .sample(
                &[("result", "failed")],
                m.binds_failed.load(Ordering::Relaxed),
            )
            .untyped("gpushare_extender_assumed_expired_total")
            .sample(&[], m.assumed_expired.load(Ordering::Relaxed))
            .untyped("gpushare_extender_bind_pod_reads_total")
            .sample(&[], m.bind_pod_reads.load(Ordering::Relaxed))
            .untyped("gpushare_extender_watch_restarts_total")
            .sample(&[], m.watch_restarts.load(Ordering::Relaxed));
        out.family("gpushare_extender_watch_objects_total", Kind::Counter)
            .sample(
                &[("resource", "nodes")],
                m.node_events.load(Ordering::Relaxed),
            )
            .sample(
                &[("resource", "pods")],
                m.pod_events.load(Ordering::Relaxed),
            );
        out.family("gpushare_extender_filter_rejections_total", Kind::Counter);
        for (reason, n) in FILTER_REASONS.iter().zip(&m.filter_rejections) {
            out.sample(&[("reason", reason)], n.load(Ordering::Relaxed));
        }
        let c = self.lock();
        let (mut assumed, mut bound) = (0, 0);
        for (_, a) in c.allocations() {
            if a.bound { bound += 1 } else { assumed += 1 }
        }
        out.family("gpushare_extender_allocations", Kind::Gauge)
            .sample(&[("state", "assumed")], assumed)
            .sample(&[("state", "bound")], bound)
            .untyped("gpushare_extender_gpu_nodes")
            .sample(&[], c.gpu_nodes())
            .untyped("gpushare_extender_learned_requests")
            .sample(&[], c.learned_requests())
            .untyped("gpushare_extender_typical_shapes")
            .sample(&[], c.typical_shapes());
        out.family("gpushare_gpu_memory_allocated_mib", Kind::Gauge);
        for (node, gpus) in c.usage() {
            for (i, g) in gpus.iter().enumerate() {
                let i = i.to_string();
                let l = [("node", node.as_str()), ("gpu", i.as_str())];
                out.sample(&l, g.memory_allocated_mib)
                    .sample_of("gpushare_gpu_memory_mib", &l, g.memory_mib)
                    .sample_of(
                        "gpushare_gpu_core_allocated_percent",
                        &l,
                        g.core_allocated_milli / 10,
                    )
                    .sample_of("gpushare_gpu_pods", &l, g.pods);
            }
        }
        out.sample_of("gpushare_extender_synced", &[], self.synced() as u8);
        out.finish()
    }

    pub fn allocations_json(&self) -> serde_json::Value {
        let c = self.lock();
        let mut v: Vec<serde_json::Value> = c
            .allocations()
            .map(|(uid, a)| {
                serde_json::json!({
                    "uid": uid, "pod": a.pod, "node": a.node, "gpus": a.gpus,
                    "bound": a.bound,
                })
            })
            .collect();
        v.sort_by(|a, b| a["pod"].as_str().cmp(&b["pod"].as_str()));
        serde_json::json!({ "allocations": v, "usage": c.usage() })
    }
}

/// What the Binding of a GPU pod carries onto it: the assignment and the ACK annotations.
fn binding_annotations(c: &Cluster, node: &str, reserved: &Reserved) -> Annotations {
    let unit = c.names().memory_unit.mib();
    let first = reserved.allocation.gpus.first().copied().unwrap_or(0);
    let dev = c
        .engine()
        .node_id(node)
        .and_then(|id| c.engine().nodes()[id].gpus.get(first as usize))
        .map(|g| g.memory_mib / unit);
    let mut ann = Annotations::new();
    ann.insert(ASSIGNMENT_ANNOTATION.into(), reserved.assignment.to_json());
    // Saturating: each share is bounded by its GPU, but the sum must never wrap.
    let pod_mem: u64 = reserved
        .assignment
        .containers
        .values()
        .flatten()
        .fold(0, |acc: u64, s| acc.saturating_add(s.memory_mib));
    ann.insert(ACK_GPU_MEM_IDX.into(), first.to_string());
    ann.insert(ACK_GPU_MEM_POD.into(), (pod_mem / unit).to_string());
    ann.insert(ACK_GPU_MEM_ASSIGNED.into(), "false".into());
    ann.insert(
        ACK_GPU_MEM_ASSUME_TIME.into(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            .to_string(),
    );
    if let Some(dev) = dev {
        ann.insert(ACK_GPU_MEM_DEV.into(), dev.to_string());
    }
    ann
}

fn candidate_names(args: &ExtenderArgs) -> std::borrow::Cow<'_, [String]> {
    if let Some(n) = &args.node_names {
        return n.as_slice().into();
    }
    args.nodes
        .as_ref()
        .map(|l| {
            l.items
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into()
}

/// Now, as an RFC 3339 date-time in UTC.
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    gpushare_core::rfc3339::format_unix(secs)
}

pub fn router(ext: Arc<Extender>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/allocations", get(allocations))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(ext)
}

// The bodies are decoded by `wire::decode` rather than axum's `Json`, whose rejection quotes
// the offending value whole: errors name the field path and stay short.

/// A JSON body, as axum's `Json` answers it.
fn json(body: Vec<u8>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

async fn filter(State(e): State<Arc<Extender>>, body: Bytes) -> Response {
    json(e.filter_body_json(&body))
}

async fn prioritize(State(e): State<Arc<Extender>>, body: Bytes) -> Response {
    match e.prioritize_body_json(&body) {
        Ok(p) => json(p),
        Err(err) => (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response(),
    }
}

async fn bind(State(e): State<Arc<Extender>>, body: Bytes) -> impl IntoResponse {
    Json(match ExtenderBindingArgs::decode(&body) {
        Ok(a) => e.bind(&a).await,
        Err(err) => {
            e.metrics.binds_failed.fetch_add(1, Ordering::Relaxed);
            ExtenderBindingResult {
                error: err.to_string(),
            }
        }
    })
}

async fn healthz(State(e): State<Arc<Extender>>) -> impl IntoResponse {
    if e.synced() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "cache not synced\n")
    }
}

async fn metrics(State(e): State<Arc<Extender>>) -> impl IntoResponse {
    e.metrics_text()
}

async fn allocations(State(e): State<Arc<Extender>>) -> impl IntoResponse {
    Json(e.allocations_json())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Knows one pod (`ns/p`, UID `u`, no GPU resources); binds nothing.
    pub(crate) struct OnePod;

    #[async_trait]
    impl Binder for OnePod {
        async fn get_pod(&self, pod: &PodKey) -> Result<Pod, ApiError> {
            if pod.name != "p" {
                return Err(ApiError::GetPod {
                    pod: pod.clone(),
                    source: "not found".into(),
                });
            }
            let mut p = Pod::default();
            p.metadata.namespace = Some(pod.namespace.clone());
            p.metadata.name = Some(pod.name.clone());
            p.metadata.uid = Some("u".into());
            Ok(p)
        }
        async fn bind(
            &self,
            _: &PodKey,
            _: &str,
            _: &str,
            _: &Annotations,
        ) -> Result<(), ApiError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn refusals_and_faults_answer_with_their_message() {
        let cluster = Cluster::new(
            "gpushare",
            gpushare_core::request::ResourceNames::default(),
            std::time::Duration::from_secs(60),
        );
        let ext = Extender::new(cluster, Arc::new(OnePod));
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        let args = |name: &str, uid: &str| ExtenderBindingArgs {
            pod_name: name.into(),
            pod_namespace: "ns".into(),
            pod_uid: uid.into(),
            node: "a".into(),
        };
        let e = ext.bind_inner(&args("q", "")).await.unwrap_err();
        assert!(e.is_fault(), "{e:?}");
        assert_eq!(e.to_string(), "cannot read pod ns/q: not found");
        let e = ext.bind_inner(&args("p", "v")).await.unwrap_err();
        assert!(!e.is_fault(), "{e:?}");
        assert_eq!(
            ExtenderBindingResult::from(e).error,
            "pod ns/p has UID u, the bind request names v"
        );
        // A pod without GPUs (asked when the extender manages every pod) is bound as it is.
        let answer = ext.bind(&args("p", "u")).await;
        assert_eq!(answer.error, "");
        assert_eq!(ext.metrics.binds_ok.load(Ordering::Relaxed), 1);
        assert_eq!(ext.metrics.binds_failed.load(Ordering::Relaxed), 0);
        let r = ext.filter(&ExtenderArgs::default());
        assert_eq!(r.error, "filter: the request carries no Pod");
        // Found by fuzzing: a 253-byte pod name and UID (each a possible Kubernetes name) made
        // a 549-character refusal; names are shown cut.
        let long = "u".repeat(253);
        let mut a = args("p", &long);
        a.pod_namespace = "n".repeat(253);
        let e = ext.bind_inner(&a).await.unwrap_err().to_string();
        assert!(e.len() < 300, "{} characters: {e}", e.len());
        assert!(e.contains("(253 bytes)"), "{e}");
    }

    /// How [`GpuPod`]'s Binding ends.
    #[derive(Clone, Copy, PartialEq)]
    enum BindEnd {
        Ok,
        /// Someone else's bind won the race: the pod is bound (without our annotations).
        Conflict,
        /// Ours went through, but its answer was lost.
        AnswerLost,
        /// Ours went through, its answer was lost, and the pod cannot be read afterwards.
        AnswerLostUnreadable,
        /// The pod was deleted before its Binding: 404, and it is gone afterwards.
        Deleted,
    }

    /// One GPU pod `default/g` (2 GiB, 30 %) with a scheduler name; `bind` waits for `gate`
    /// and then ends as `end` says; Bindings and pod reads are recorded.
    struct GpuPod {
        scheduler: Option<String>,
        bound_to: std::sync::Mutex<Option<String>>,
        /// The pod's annotations (what a Binding of ours carried onto it).
        annotations: std::sync::Mutex<Option<Annotations>>,
        gate: tokio::sync::Notify,
        end: BindEnd,
        /// Every Binding asked for.
        bindings: std::sync::Mutex<Vec<Annotations>>,
        reads: AtomicU64,
        /// `get_pod` fails (set by a Binding ending `AnswerLostUnreadable`).
        unreadable: std::sync::atomic::AtomicBool,
        /// `get_pod` finds no pod (set by a Binding ending `Deleted`).
        gone: std::sync::atomic::AtomicBool,
    }

    impl GpuPod {
        fn new(scheduler: Option<&str>, end: BindEnd) -> Arc<GpuPod> {
            Arc::new(GpuPod {
                scheduler: scheduler.map(str::to_string),
                bound_to: Default::default(),
                annotations: Default::default(),
                gate: tokio::sync::Notify::new(),
                end,
                bindings: Default::default(),
                reads: AtomicU64::new(0),
                unreadable: Default::default(),
                gone: Default::default(),
            })
        }
    }

    #[async_trait]
    impl Binder for GpuPod {
        async fn get_pod(&self, _: &PodKey) -> Result<Pod, ApiError> {
            use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
            use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
            self.reads.fetch_add(1, Ordering::Relaxed);
            if self.gone.load(Ordering::Relaxed) {
                return Err(ApiError::PodGone {
                    pod: PodKey {
                        namespace: "default".into(),
                        name: "g".into(),
                    },
                });
            }
            if self.unreadable.load(Ordering::Relaxed) {
                return Err(ApiError::GetPod {
                    pod: PodKey {
                        namespace: "default".into(),
                        name: "g".into(),
                    },
                    source: "429 Too Many Requests".into(),
                });
            }
            let mut p = Pod::default();
            p.metadata.annotations = self.annotations.lock().unwrap().clone();
            p.metadata.namespace = Some("default".into());
            p.metadata.name = Some("g".into());
            p.metadata.uid = Some("uid-g".into());
            p.spec = Some(PodSpec {
                scheduler_name: self.scheduler.clone(),
                node_name: self.bound_to.lock().unwrap().clone(),
                containers: vec![Container {
                    name: "main".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(
                            [
                                ("aliyun.com/gpu-mem".to_string(), Quantity("2".into())),
                                (
                                    "aliyun.com/gpu-core.percentage".to_string(),
                                    Quantity("30".into()),
                                ),
                            ]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            });
            Ok(p)
        }
        async fn bind(
            &self,
            pod: &PodKey,
            _: &str,
            node: &str,
            a: &Annotations,
        ) -> Result<(), ApiError> {
            self.bindings.lock().unwrap().push(a.clone());
            self.gate.notified().await;
            *self.bound_to.lock().unwrap() = Some(node.to_string());
            let err = |msg: &str| ApiError::Bind {
                pod: pod.clone(),
                node: node.into(),
                source: msg.into(),
            };
            match self.end {
                BindEnd::Ok => {
                    *self.annotations.lock().unwrap() = Some(a.clone());
                    Ok(())
                }
                BindEnd::Conflict => Err(err("409 Conflict: pod is already assigned")),
                BindEnd::AnswerLost => {
                    *self.annotations.lock().unwrap() = Some(a.clone());
                    Err(err("connection reset"))
                }
                BindEnd::AnswerLostUnreadable => {
                    *self.annotations.lock().unwrap() = Some(a.clone());
                    self.unreadable.store(true, Ordering::Relaxed);
                    Err(err("connection reset"))
                }
                BindEnd::Deleted => {
                    *self.bound_to.lock().unwrap() = None;
                    self.gone.store(true, Ordering::Relaxed);
                    Err(err("404 Not Found: pods \"g\" not found"))
                }
            }
        }
    }

    fn gpu_cluster() -> Cluster {
        let mut cluster = Cluster::new(
            "gpushare",
            gpushare_core::request::ResourceNames::default(),
            std::time::Duration::from_secs(60),
        );
        let mut node = sim_node("a", 1);
        node.metadata.labels =
            Some([("ack.node.gpu.schedule".to_string(), "core_mem".to_string())].into());
        cluster.set_node(&node);
        cluster
    }

    /// Node `name` with `gpus` simulated 15 GiB GPUs in its `gpushare.io/gpus` annotation.
    fn sim_node(name: &str, gpus: u32) -> k8s_openapi::api::core::v1::Node {
        use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus};
        let gpus = NodeGpus::uniform(gpus, "sim", 15360);
        let mut node = k8s_openapi::api::core::v1::Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.annotations =
            Some([(NODE_GPUS_ANNOTATION.to_string(), gpus.to_json())].into());
        node
    }

    fn bind_g(node: &str) -> ExtenderBindingArgs {
        ExtenderBindingArgs {
            pod_name: "g".into(),
            pod_namespace: "default".into(),
            pod_uid: "uid-g".into(),
            node: node.into(),
        }
    }

    #[tokio::test]
    async fn filter_counts_each_node_it_rules_out() {
        let binder = GpuPod::new(None, BindEnd::Ok);
        let key = PodKey {
            namespace: "default".into(),
            name: "g".into(),
        };
        let pod = binder.get_pod(&key).await.unwrap();
        let ext = Extender::new(gpu_cluster(), binder);
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        let args = ExtenderArgs {
            pod: Some(pod),
            nodes: None,
            node_names: Some(vec!["a".into(), "zz".into(), "yy".into()]),
        };
        let r = ext.filter(&args);
        assert_eq!(r.node_names.as_deref(), Some(&["a".to_string()][..]));
        let text = ext.metrics_text();
        assert!(
            text.contains("gpushare_extender_filter_rejections_total{reason=\"unknown_node\"} 2\n"),
            "{text}"
        );
        let counted: u64 = text
            .lines()
            .filter(|l| l.starts_with("gpushare_extender_filter_rejections_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(counted, 2, "{text}");
    }

    #[tokio::test]
    async fn bind_refuses_what_it_must_not_do() {
        let binder = GpuPod::new(None, BindEnd::Ok);
        let ext = Extender::new(gpu_cluster(), binder.clone());
        // Before both watches have listed: no bind.
        let e = ext.bind_inner(&bind_g("a")).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpushare scheduler: cache not synced with the API server yet"
        );
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        // Names that are not Kubernetes names.
        for (args, want) in [
            (
                ExtenderBindingArgs {
                    pod_namespace: "Default".into(),
                    ..bind_g("a")
                },
                "bind: PodNamespace \"Default\" is not a valid Kubernetes name",
            ),
            (
                ExtenderBindingArgs {
                    pod_name: "../x".into(),
                    ..bind_g("a")
                },
                "bind: PodName \"../x\" is not a valid Kubernetes name",
            ),
            (
                bind_g(&"n".repeat(300)),
                "bind: Node \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn…\" (300 bytes) is longer than 253 bytes",
            ),
            (
                bind_g("Node_A"),
                "bind: Node \"Node_A\" is not a valid Kubernetes name",
            ),
        ] {
            assert_eq!(ext.bind_inner(&args).await.unwrap_err().to_string(), want);
        }
        // A pod of another scheduler is not ours to bind.
        let ext = Extender::new(
            gpu_cluster(),
            GpuPod::new(Some("other-scheduler"), BindEnd::Ok),
        );
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        assert_eq!(
            ext.bind_inner(&bind_g("a")).await.unwrap_err().to_string(),
            "pod default/g has schedulerName \"other-scheduler\"; this extender binds pods of \"default-scheduler, gpushare-scheduler\" only"
        );
        assert!(
            binder.bindings.lock().unwrap().is_empty(),
            "nothing written"
        );
    }

    #[tokio::test]
    async fn one_bind_per_pod_and_a_bound_pod_keeps_its_assignment() {
        // A second /bind while the first is under way is refused and changes nothing.
        let binder = GpuPod::new(Some("gpushare-scheduler"), BindEnd::Ok);
        let ext = Arc::new(Extender::new(gpu_cluster(), binder.clone()));
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        let first = tokio::spawn({
            let ext = ext.clone();
            async move { ext.bind_inner(&bind_g("a")).await }
        });
        while binder.bindings.lock().unwrap().is_empty() {
            assert!(!first.is_finished(), "the first bind ended early");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let e = ext.bind_inner(&bind_g("a")).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod default/g: a bind for it is already in progress"
        );
        binder.gate.notify_one();
        first.await.unwrap().expect("the first bind succeeds");
        let written = binder.bindings.lock().unwrap().clone();
        assert_eq!(written.len(), 1, "one Binding");
        assert!(
            written[0][ASSIGNMENT_ANNOTATION].contains("\"corePercent\":30"),
            "the Binding carries the assignment: {written:?}"
        );
        let allocs = ext.allocations_json();
        assert_eq!(
            allocs["allocations"].as_array().map(Vec::len),
            Some(1),
            "{allocs}"
        );

        // The Binding fails because someone else bound the pod meanwhile: nothing of ours was
        // written, and the GPUs are given back.
        let binder = GpuPod::new(None, BindEnd::Conflict);
        let ext = Arc::new(Extender::new(gpu_cluster(), binder.clone()));
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        binder.gate.notify_one();
        let e = ext.bind_inner(&bind_g("a")).await.unwrap_err();
        assert!(e.is_fault(), "{e}");
        let allocs = ext.allocations_json();
        assert_eq!(
            allocs["allocations"].as_array().map(Vec::len),
            Some(0),
            "{allocs}"
        );

        // Ours went through but its answer was lost: the cache holds what the pod carries,
        // also after kube-scheduler's retry (refused: the pod is bound).
        let binder = GpuPod::new(None, BindEnd::AnswerLost);
        let ext = Arc::new(Extender::new(gpu_cluster(), binder.clone()));
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        binder.gate.notify_one();
        assert!(ext.bind_inner(&bind_g("a")).await.unwrap_err().is_fault());
        let held = |ext: &Extender| {
            let allocs = ext.allocations_json();
            allocs["allocations"].as_array().map(Vec::len)
        };
        assert_eq!(held(&ext), Some(1));
        let e = ext.bind_inner(&bind_g("a")).await.unwrap_err();
        assert!(e.to_string().contains("already bound"), "{e}");
        assert_eq!(held(&ext), Some(1));
    }

    #[tokio::test]
    async fn a_retried_bind_never_gives_away_a_bound_pods_gpus() {
        let key = PodKey {
            namespace: "default".into(),
            name: "g".into(),
        };
        let filter_g = |ext: &Extender, pod: &Pod| {
            let body = serde_json::to_vec(&ExtenderArgs {
                pod: Some(pod.clone()),
                nodes: None,
                node_names: Some(vec!["a".into()]),
            })
            .unwrap();
            let r = ext.filter_body(&body);
            assert_eq!(r.node_names.as_deref(), Some(&["a".to_string()][..]));
        };
        let held = |ext: &Extender| ext.allocations_json()["allocations"].clone();

        // Bound, and seen so by the watch; kube-scheduler (its wait for the answer over)
        // filters the pod again from its own stale copy and binds it again: refused, and the
        // pod keeps what it holds. Before, the retry gave the GPUs back and reserved anew
        // from filter's stale copy, leaving them free to others while its Binding failed.
        let binder = GpuPod::new(None, BindEnd::Ok);
        let unbound = binder.get_pod(&key).await.unwrap();
        let ext = Extender::new(gpu_cluster(), binder.clone());
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        filter_g(&ext, &unbound);
        binder.gate.notify_one();
        ext.bind_inner(&bind_g("a")).await.expect("bound");
        let bound = binder.get_pod(&key).await.unwrap();
        ext.lock().observe_pod(&bound);
        let before = held(&ext);
        assert_eq!(before.as_array().map(Vec::len), Some(1), "{before}");
        filter_g(&ext, &unbound);
        let e = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            ext.bind_inner(&bind_g("a")),
        )
        .await
        .expect("the retry does not reach a Binding")
        .unwrap_err();
        assert!(e.to_string().contains("already bound"), "{e}");
        assert_eq!(held(&ext), before, "the bound pod keeps its GPUs");
        assert_eq!(binder.bindings.lock().unwrap().len(), 1, "one Binding");

        // The Binding went through, its answer was lost, and the pod cannot be read: bound
        // or not is unknown, so the reservation stays (the watch or its expiry settles it).
        let binder = GpuPod::new(None, BindEnd::AnswerLostUnreadable);
        let ext = Extender::new(gpu_cluster(), binder.clone());
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        binder.gate.notify_one();
        assert!(ext.bind_inner(&bind_g("a")).await.unwrap_err().is_fault());
        let allocs = held(&ext);
        assert_eq!(allocs.as_array().map(Vec::len), Some(1), "{allocs}");

        // The pod was deleted while kube-scheduler placed it: the API server says it does not
        // exist, so its reservation is given back at once (the watch never reports an unbound
        // pod's deletion; waiting for the expiry kept its GPUs from other pods for a minute).
        let binder = GpuPod::new(None, BindEnd::Deleted);
        let ext = Extender::new(gpu_cluster(), binder.clone());
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        binder.gate.notify_one();
        let e = ext.bind_inner(&bind_g("a")).await.unwrap_err();
        assert!(e.is_fault(), "{e}");
        let allocs = held(&ext);
        assert_eq!(allocs.as_array().map(Vec::len), Some(0), "{allocs}");
    }

    #[tokio::test]
    async fn bind_takes_the_pod_filter_saw() {
        let binder = GpuPod::new(None, BindEnd::Ok);
        let key = PodKey {
            namespace: "default".into(),
            name: "g".into(),
        };
        let pod = binder.get_pod(&key).await.unwrap();
        let ext = Extender::new(gpu_cluster(), binder.clone());
        ext.synced_nodes.store(true, Ordering::Release);
        ext.synced_pods.store(true, Ordering::Release);
        let body = serde_json::to_vec(&ExtenderArgs {
            pod: Some(pod),
            nodes: None,
            node_names: Some(vec!["a".into()]),
        })
        .unwrap();
        let r = ext.filter_body(&body);
        assert_eq!(r.node_names.as_deref(), Some(&["a".to_string()][..]));
        let reads = binder.reads.load(Ordering::Relaxed);
        binder.gate.notify_one();
        ext.bind_inner(&bind_g("a")).await.expect("bound");
        assert_eq!(
            binder.reads.load(Ordering::Relaxed),
            reads,
            "no read of the pod"
        );
        assert_eq!(ext.metrics.bind_pod_reads.load(Ordering::Relaxed), 0);
        // Another UID than filter saw: read from the API server (and refused there).
        let e = ext
            .bind_inner(&ExtenderBindingArgs {
                pod_uid: "uid-other".into(),
                ..bind_g("a")
            })
            .await
            .unwrap_err();
        assert_eq!(binder.reads.load(Ordering::Relaxed), reads + 1);
        assert_eq!(ext.metrics.bind_pod_reads.load(Ordering::Relaxed), 1);
        assert!(e.to_string().contains("the bind request names"), "{e}");
    }

    #[test]
    fn metrics_text_is_exact() {
        let mut cluster = Cluster::new(
            "gpushare",
            gpushare_core::request::ResourceNames::default(),
            std::time::Duration::from_secs(60),
        );
        cluster.set_node(&sim_node("a", 2));
        let ext = Extender::new(cluster, Arc::new(OnePod));
        ext.metrics.binds_ok.fetch_add(5, Ordering::Relaxed);
        ext.metrics.binds_failed.fetch_add(2, Ordering::Relaxed);
        ext.metrics.assumed_expired.fetch_add(1, Ordering::Relaxed);
        ext.metrics.filter_rejections[8].fetch_add(3, Ordering::Relaxed);
        ext.metrics.watch_restarts.fetch_add(4, Ordering::Relaxed);
        ext.metrics.node_events.fetch_add(6, Ordering::Relaxed);
        ext.metrics.pod_events.fetch_add(7, Ordering::Relaxed);
        ext.synced_nodes.store(true, Ordering::Release);
        assert_eq!(
            ext.metrics_text(),
            include_str!("../../tests/golden/extender_metrics.txt")
        );
    }

    #[test]
    fn rfc3339() {
        let s = now_rfc3339();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'), "{s}");
    }
}
