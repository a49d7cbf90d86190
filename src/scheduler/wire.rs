//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`). The Go structs
//! carry no JSON tags, so the keys are the Go field names (PascalCase); the pod inside is an
//! ordinary Kubernetes object.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Node, Pod};

/// `v1.NodeList`.
pub type NodeList = List<Node>;
use gpushare_core::echo::{Echo, cut_message};
use serde::{Deserialize, Serialize};

/// Scores the extender returns are in [0, MAX_SCORE] (`extenderv1.MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// Arguments of `filter` and `prioritize`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    #[serde(default)]
    pub pod: Option<Pod>,
    /// Only when the extender is not `nodeCacheCapable`.
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// Only when the extender is `nodeCacheCapable`.
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
}

/// A candidate node name as decoded from a request body: borrowed from the body unless the
/// JSON string has escapes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeName<'a>(#[serde(borrow)] pub Cow<'a, str>);

/// [`ExtenderArgs`] as the HTTP handlers decode it: the node names borrowed from the body (a
/// 5,000-node request is 5,000 names; copying each one costs more than deciding on it).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgsRef<'a> {
    #[serde(default)]
    pub pod: Option<Pod>,
    #[serde(default)]
    pub nodes: Option<NodeList>,
    #[serde(default, borrow)]
    pub node_names: Option<Vec<NodeName<'a>>>,
}

impl<'a> ExtenderArgsRef<'a> {
    /// Decodes the body of `verb` (`filter`, `prioritize`) as [`decode`] does: a body that
    /// does not decode is refused with the same error.
    pub fn decode(verb: &'static str, body: &'a [u8]) -> Result<Self, WireError> {
        if body.len() > MAX_BODY {
            return Err(WireError::TooLarge {
                verb,
                len: body.len(),
            });
        }
        if let Ok(args) = serde_json::from_slice(body) {
            return Ok(args);
        }
        // The error, with its field path (or, should the owned decoding accept what the
        // borrowing one did not, its value).
        let args: ExtenderArgs = decode(verb, body)?;
        Ok(ExtenderArgsRef {
            pod: args.pod,
            nodes: args.nodes,
            node_names: args
                .node_names
                .map(|v| v.into_iter().map(|n| NodeName(Cow::Owned(n))).collect()),
        })
    }

    /// The candidate nodes: `NodeNames` (a `nodeCacheCapable` extender's), else the names of
    /// `Nodes`' items.
    pub fn candidates(&self) -> Vec<&str> {
        if let Some(n) = &self.node_names {
            return n.iter().map(|n| &*n.0).collect();
        }
        self.nodes
            .as_ref()
            .map(|l| {
                l.items
                    .iter()
                    .filter_map(|n| n.metadata.name.as_deref())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Result of `filter`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
    #[serde(default)]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(default)]
    pub error: String,
}

/// [`ExtenderFilterResult`] with the node names borrowed from the request: what `filter`
/// computes; serialized exactly as [`ExtenderFilterResult`] (whose `Nodes` it never sets).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct FilterAnswer<'a> {
    pub node_names: Option<Vec<&'a str>>,
    pub failed_nodes: BTreeMap<&'a str, String>,
    pub failed_and_unresolvable_nodes: BTreeMap<&'a str, String>,
    pub error: String,
}

impl FilterAnswer<'_> {
    pub fn into_owned(self) -> ExtenderFilterResult {
        fn owned(m: BTreeMap<&str, String>) -> BTreeMap<String, String> {
            m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
        }
        ExtenderFilterResult {
            nodes: None,
            node_names: self
                .node_names
                .map(|v| v.into_iter().map(str::to_string).collect()),
            failed_nodes: owned(self.failed_nodes),
            failed_and_unresolvable_nodes: owned(self.failed_and_unresolvable_nodes),
            error: self.error,
        }
    }
}

/// `prioritize`'s answer with the node names borrowed from the request: serialized as the JSON
/// array of [`HostPriority`] it stands for.
pub struct Priorities<'a> {
    pub hosts: Vec<&'a str>,
    /// Same length as `hosts`.
    pub scores: Vec<i64>,
}

impl Serialize for Priorities<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry<'a> {
            host: &'a str,
            score: i64,
        }
        s.collect_seq(
            self.hosts
                .iter()
                .zip(&self.scores)
                .map(|(&host, &score)| Entry { host, score }),
        )
    }
}

impl Priorities<'_> {
    pub fn into_owned(self) -> Vec<HostPriority> {
        self.hosts
            .into_iter()
            .zip(self.scores)
            .map(|(host, score)| HostPriority {
                host: host.to_string(),
                score,
            })
            .collect()
    }
}

/// One entry of `prioritize`'s answer (a bare JSON array of these).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// Arguments of `bind`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    pub node: String,
}

/// Result of `bind`: empty `Error` means bound.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    #[serde(default)]
    pub error: String,
}

/// Why an extender request body is refused. Messages name the verb and what is wrong, and show
/// outside text cut: kube-scheduler logs them, and a body may be megabytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not JSON at all (a syntax error).
    #[error("{verb}: the request body is not valid JSON: {reason}")]
    Malformed { verb: &'static str, reason: String },
    /// JSON, but a field is not what the verb takes; `path` names it (`Pod.spec.containers[0]`,
    /// empty for the body itself).
    #[error("{verb}: the request body{} is not valid: {reason}", place(path))]
    Schema {
        verb: &'static str,
        path: String,
        reason: String,
    },
    /// Larger than the extender takes (the HTTP server refuses it before decoding, too).
    #[error("{verb}: the request body is {len} bytes, at most {MAX_BODY} are accepted")]
    TooLarge { verb: &'static str, len: usize },
    /// A bind argument that cannot name a Kubernetes object.
    #[error("{verb}: {field} {value} {why}")]
    BadArgument {
        verb: &'static str,
        field: &'static str,
        value: Echo,
        why: &'static str,
    },
}

fn place(path: &str) -> String {
    if path.is_empty() || path == "." {
        String::new()
    } else {
        format!("'s {path}")
    }
}

/// Longest library error text kept in a [`WireError`] (serde's messages quote the offending
/// value whole).
const REASON_MAX: usize = 160;
/// Longest field path kept (map keys in it come from the body).
const PATH_MAX: usize = 120;

/// Largest request body the extender decodes (axum's default limit, set explicitly on the
/// router).
pub const MAX_BODY: usize = 2 << 20;

/// Decodes the body of `verb` (`filter`, `prioritize`, `bind`): JSON syntax errors and schema
/// errors apart, the schema error naming the field path.
pub fn decode<T: serde::de::DeserializeOwned>(
    verb: &'static str,
    body: &[u8],
) -> Result<T, WireError> {
    if body.len() > MAX_BODY {
        return Err(WireError::TooLarge {
            verb,
            len: body.len(),
        });
    }
    // Tracking the field path costs on every value: only a body that fails is decoded again
    // with it, for the error.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let reason = cut_message(&e.inner().to_string(), REASON_MAX);
        match e.inner().classify() {
            serde_json::error::Category::Data => WireError::Schema {
                verb,
                path: cut_message(&e.path().to_string(), PATH_MAX),
                reason,
            },
            _ => WireError::Malformed { verb, reason },
        }
    })?;
    de.end().map_err(|e| WireError::Malformed {
        verb,
        reason: cut_message(&e.to_string(), REASON_MAX),
    })?;
    Ok(value)
}

/// Longest Kubernetes object name (a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;

impl ExtenderBindingArgs {
    /// Decodes and checks a `bind` body: pod name, namespace and node must be names a
    /// Kubernetes object can have (not empty, at most [`MAX_NAME_LEN`] bytes); so must the UID
    /// when given.
    pub fn decode(body: &[u8]) -> Result<ExtenderBindingArgs, WireError> {
        let args: ExtenderBindingArgs = decode("bind", body)?;
        args.check()?;
        Ok(args)
    }

    pub fn check(&self) -> Result<(), WireError> {
        let bad = |field, value: &str, why| WireError::BadArgument {
            verb: "bind",
            field,
            value: Echo::new(value),
            why,
        };
        for (field, value) in [
            ("PodName", &self.pod_name),
            ("PodNamespace", &self.pod_namespace),
            ("Node", &self.node),
            ("PodUID", &self.pod_uid),
        ] {
            if value.is_empty() && field != "PodUID" {
                return Err(bad(field, value, "is empty"));
            }
            if value.len() > MAX_NAME_LEN {
                return Err(bad(field, value, "is longer than 253 bytes"));
            }
            if value.chars().any(char::is_control) {
                return Err(bad(field, value, "has a control character"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_field_names() {
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"Pod":{"metadata":{"name":"p","namespace":"default"}},"Nodes":null,"NodeNames":["n1","n2"]}"#,
        )
        .unwrap();
        assert_eq!(a.node_names.unwrap(), ["n1", "n2"]);
        assert_eq!(a.pod.unwrap().metadata.name.as_deref(), Some("p"));
        let r = ExtenderFilterResult {
            node_names: Some(vec!["n1".into()]),
            failed_nodes: [("n2".to_string(), "why".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"NodeNames":["n1"],"FailedNodes":{"n2":"why"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        let b: ExtenderBindingArgs = serde_json::from_str(
            r#"{"PodName":"p","PodNamespace":"ns","PodUID":"u-1","Node":"n1"}"#,
        )
        .unwrap();
        assert_eq!((b.pod_uid.as_str(), b.node.as_str()), ("u-1", "n1"));
        assert_eq!(
            serde_json::to_string(&vec![HostPriority {
                host: "n1".into(),
                score: 10
            }])
            .unwrap(),
            r#"[{"Host":"n1","Score":10}]"#
        );
    }

    /// The handlers' decoding borrows the names (unless escaped) and answers as the owned
    /// types do, byte for byte.
    #[test]
    fn borrowed_args_and_answers_match_the_owned_ones() {
        let body = br#"{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n1","n\u0032",""]}"#;
        let a = ExtenderArgsRef::decode("filter", body).unwrap();
        let names = a.node_names.as_ref().unwrap();
        assert!(matches!(names[0].0, Cow::Borrowed("n1")));
        assert!(matches!(&names[1].0, Cow::Owned(n) if n == "n2"));
        assert_eq!(a.candidates(), ["n1", "n2", ""]);
        let owned: ExtenderArgs = decode("filter", body).unwrap();
        assert_eq!(owned.node_names.unwrap(), a.candidates());
        let a = ExtenderArgsRef::decode(
            "filter",
            br#"{"Nodes":{"items":[{"metadata":{"name":"a"}},{"metadata":{}}]}}"#,
        )
        .unwrap();
        assert_eq!(a.candidates(), ["a"]);
        for body in [
            &b"{\"Pod\":"[..],
            br#"{"NodeNames":[1]}"#,
            br#"{"NodeNames":[],"NodeNames":[]}"#,
            br#"{"Pod":{"spec":{"containers":[{"name":1}]}}}"#,
        ] {
            assert_eq!(
                ExtenderArgsRef::decode("prioritize", body).unwrap_err(),
                decode::<ExtenderArgs>("prioritize", body).unwrap_err()
            );
        }
        let answer = FilterAnswer {
            node_names: Some(vec!["n1", "n3"]),
            failed_nodes: [("n2", "why".to_string())].into(),
            failed_and_unresolvable_nodes: [("n0", "never".to_string())].into(),
            error: String::new(),
        };
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            serde_json::to_string(&answer.clone().into_owned()).unwrap()
        );
        let none = FilterAnswer {
            error: "e".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&none).unwrap(),
            serde_json::to_string(&none.into_owned()).unwrap()
        );
        let p = Priorities {
            hosts: vec!["n1", "n2"],
            scores: vec![10, 0],
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"[{"Host":"n1","Score":10},{"Host":"n2","Score":0}]"#
        );
        assert_eq!(
            serde_json::to_string(&p.into_owned()).unwrap(),
            r#"[{"Host":"n1","Score":10},{"Host":"n2","Score":0}]"#
        );
    }

    /// Hardening items 1 and 2 for the extender: syntax and schema errors apart, the schema
    /// error naming the field path, every echoed value cut.
    #[test]
    fn bodies_are_decoded_with_paths_and_short_errors() {
        let e = decode::<ExtenderArgs>("filter", b"{\"Pod\":").unwrap_err();
        assert_eq!(
            e.to_string(),
            "filter: the request body is not valid JSON: EOF while parsing a value at line 1 column 7"
        );
        let big = "x".repeat(1 << 20);
        let body = format!(
            r#"{{"Pod":{{"spec":{{"containers":[{{"name":1}}]}}}},"NodeNames":["{big}"]}}"#
        );
        let e = decode::<ExtenderArgs>("filter", body.as_bytes()).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "filter: the request body's Pod.spec.containers[0].name is not valid: invalid type: integer `1`, expected a string"
            ),
            "{e}"
        );
        let body = format!(r#"{{"NodeNames":[{{"{big}":1}}]}}"#);
        let e = decode::<ExtenderArgs>("prioritize", body.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400, "{}", &e[..400]);
        let body = format!(r#"{{"PodName":"{big}","PodNamespace":"ns","PodUID":"","Node":"n"}}"#);
        let e = ExtenderBindingArgs::decode(body.as_bytes())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "bind: PodName \"{}…\" (1048576 bytes) is longer than 253 bytes",
                "x".repeat(64)
            )
        );
        let e = ExtenderBindingArgs::decode(
            br#"{"PodName":"p","PodNamespace":"ns","PodUID":"","Node":""}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "bind: Node \"\" is empty");
        let e = decode::<ExtenderBindingArgs>("bind", br#"{"PodName":"p"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bind: the request body is not valid: missing field `PodNamespace` at line 1 column 15"
        );
        let e = decode::<ExtenderBindingArgs>(
            "bind",
            br#"{"PodName":"p","PodNamespace":"ns","PodUID":"","Node":"n"} x"#,
        )
        .unwrap_err();
        assert!(matches!(e, WireError::Malformed { .. }), "{e}");
    }
}
