//! Turns client errors into messages a person can act on: which server could not be reached,
//! which verb on which resource is not allowed, what to run next. Pure: the caller adds what
//! needs another request (whether the CRD exists, which instances do).

use std::time::Duration;

use kube::Resource;

use crate::duration;
use crate::error::Problem;

/// The request that failed, in RBAC terms.
#[derive(Clone, Debug)]
pub struct Call {
    pub verb: &'static str,
    /// `plural` or `plural.group`, as RBAC and `kubectl auth can-i` spell it.
    pub resource: String,
    pub group: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The resource as RBAC rules name it, when it differs from `plural` (subresources).
    pub rbac_resource: Option<String>,
    /// A request across every namespace (`namespace` is then `None`).
    pub all_namespaces: bool,
}

impl Call {
    pub fn new<K: Resource<DynamicType = ()>>(verb: &'static str) -> Self {
        Self::dynamic(verb, &K::group(&()), &K::plural(&()))
    }

    pub fn dynamic(verb: &'static str, group: &str, plural: &str) -> Self {
        let resource = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        Self {
            verb,
            resource,
            group: group.to_owned(),
            plural: plural.to_owned(),
            namespace: None,
            name: None,
            rbac_resource: None,
            all_namespaces: false,
        }
    }

    /// A subresource such as `pods/exec` or `valkeys/scale`: RBAC names it `plural/sub`.
    pub fn subresource(mut self, subresource: &str) -> Self {
        self.resource = format!("{}/{subresource}", self.resource);
        self.rbac_resource = Some(format!("{}/{subresource}", self.plural));
        self
    }

    pub fn namespace(mut self, namespace: Option<&str>) -> Self {
        self.namespace = namespace.map(str::to_owned);
        self
    }

    pub fn all_namespaces(mut self) -> Self {
        self.namespace = None;
        self.all_namespaces = true;
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// "list valkeys.database.kuberly.io in namespace team-a"
    pub fn describe(&self) -> String {
        let mut text = format!("{} {}", self.verb, self.resource);
        if let Some(name) = &self.name {
            text.push_str(&format!(" {name:?}"));
        }
        match &self.namespace {
            Some(ns) => text.push_str(&format!(" in namespace {ns:?}")),
            None if self.all_namespaces => text.push_str(" in all namespaces"),
            None => {}
        }
        text
    }
}

/// Where the request went, for messages.
#[derive(Clone, Debug, Default)]
pub struct Target {
    pub server: String,
    pub context: Option<String>,
    pub impersonating: Option<String>,
    pub timeout: Option<Duration>,
}

impl Target {
    fn context_note(&self) -> String {
        match &self.context {
            Some(c) => format!(" (context {c:?})"),
            None => String::new(),
        }
    }
}

/// What a failed request means.
#[derive(Debug)]
pub enum Diagnosis {
    /// The API server said the named object does not exist.
    NotFound,
    /// A 404 without a Kubernetes Status: the API path itself is unknown (e.g. a missing CRD).
    UnknownPath,
    Problem(Problem),
}

pub fn diagnose(err: &kube::Error, call: &Call, target: &Target) -> Diagnosis {
    match err {
        kube::Error::Api(status) => diagnose_status(status, call, target),
        kube::Error::Auth(e) => Diagnosis::Problem(
            Problem::new(format!(
                "cannot get credentials for the cluster{}: {e}",
                target.context_note()
            ))
            .hint("check the user's credentials in the kubeconfig; an exec credential plugin must run on its own, e.g. try its command in a shell"),
        ),
        other => Diagnosis::Problem(transport(other, call, target)),
    }
}

fn diagnose_status(status: &kube::core::Status, call: &Call, target: &Target) -> Diagnosis {
    let message = status.message.trim();
    match status.code {
        404 if status.reason == "NotFound" => Diagnosis::NotFound,
        404 => Diagnosis::UnknownPath,
        401 => Diagnosis::Problem(
            Problem::new(format!(
                "the API server at {} rejected the credentials{} (401 Unauthorized)",
                target.server,
                target.context_note()
            ))
            .hint("log in again or refresh the token of the kubeconfig user (your cloud's CLI, or kubectl config set-credentials)"),
        ),
        403 => Diagnosis::Problem(forbidden(message, call, target)),
        409 => Diagnosis::Problem(Problem::new(format!(
            "cannot {}: {message}",
            call.describe()
        ))),
        422 | 400 => Diagnosis::Problem(Problem::new(format!(
            "the API server refused to {}: {}",
            call.describe(),
            invalid_details(status)
        ))),
        code => Diagnosis::Problem(
            Problem::new(format!(
                "cannot {}: the API server at {} answered {code}: {message}",
                call.describe(),
                target.server
            ))
            .hint(if code >= 500 || code == 429 {
                "the API server is overloaded or failing; try again shortly"
            } else {
                "run with -v to see the requests"
            }),
        ),
    }
}

fn invalid_details(status: &kube::core::Status) -> String {
    let causes: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| match c.field.as_str() {
            "" => c.message.clone(),
            field if c.message.starts_with(field) => c.message.clone(),
            field => format!("{field}: {}", c.message),
        })
        .collect();
    if causes.is_empty() {
        status.message.clone()
    } else {
        causes.join("; ")
    }
}

fn forbidden(message: &str, call: &Call, target: &Target) -> Problem {
    let who = api_user(message)
        .or_else(|| target.impersonating.clone())
        .unwrap_or_else(|| "USER".to_owned());
    let scope = match &call.namespace {
        Some(ns) => format!("-n {ns} "),
        None => String::new(),
    };
    let (kind, binding) = if call.namespace.is_some() {
        ("role", "rolebinding")
    } else {
        ("clusterrole", "clusterrolebinding")
    };
    let role = format!("valkey-{}-{}", call.verb, call.plural);
    Problem::new(format!(
        "forbidden: user {who:?} is not allowed to {} (RBAC verb {:?} on resource {:?}{})",
        call.describe(),
        call.verb,
        call.rbac_resource.as_deref().unwrap_or(&call.plural),
        if call.group.is_empty() {
            " of the core API group".to_owned()
        } else {
            format!(" of API group {:?}", call.group)
        }
    ))
    .hint(format!(
        "ask a cluster admin to grant it, e.g.\n  kubectl create {kind} {role} {scope}--verb={} --resource={}\n  kubectl create {binding} {role} {scope}--{kind}={role} --user={who}",
        call.verb, call.resource
    ))
}

/// The user name in an API server's Forbidden message: `User "alice" cannot list ...`.
fn api_user(message: &str) -> Option<String> {
    let rest = message.split_once("User \"")?.1;
    let user = rest.split_once('"')?.0;
    (!user.is_empty()).then(|| user.to_owned())
}

/// A request that never got an answer: connection refused, DNS, TLS, timeouts.
fn transport(err: &kube::Error, call: &Call, target: &Target) -> Problem {
    let cause = root_cause(err);
    let lower = cause.to_lowercase();
    let server = &target.server;
    let context = target.context_note();
    if lower.contains("timed out") || lower.contains("deadline") || lower.contains("elapsed") {
        let within = target
            .timeout
            .map(|t| format!(" within {}", duration::format(t)))
            .unwrap_or_default();
        return Problem::new(format!(
            "no answer from the Kubernetes API server at {server}{context}{within} while trying to {}",
            call.describe()
        ))
        .hint("check that the cluster is up and reachable from here (VPN, firewall), or raise --request-timeout");
    }
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        return Problem::new(format!(
            "cannot establish a trusted TLS connection to the Kubernetes API server at {server}{context}: {cause}"
        ))
        .hint("the kubeconfig's certificate-authority(-data) must match the server's certificate; refresh the kubeconfig from your cluster");
    }
    Problem::new(format!(
        "cannot reach the Kubernetes API server at {server}{context}: {cause}"
    ))
    .hint("check that the cluster is running and that --context / --kubeconfig / KUBECONFIG select the right one (kubectl config current-context)")
}

/// The innermost error's message: the one that names the actual failure.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use valkey_core::api::Valkey;

    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut status = kube::core::Status::failure(message, reason);
        status.code = code;
        kube::Error::Api(status.boxed())
    }

    fn target() -> Target {
        Target {
            server: "https://127.0.0.1:6443".into(),
            context: Some("dev".into()),
            ..Target::default()
        }
    }

    #[test]
    fn forbidden_names_the_verb_the_resource_and_the_user() {
        let err = status(
            403,
            "Forbidden",
            r#"valkeys.database.kuberly.io is forbidden: User "nobody" cannot list resource "valkeys" in API group "database.kuberly.io" in the namespace "team-a""#,
        );
        let call = Call::new::<Valkey>("list").namespace(Some("team-a"));
        let Diagnosis::Problem(p) = diagnose(&err, &call, &target()) else {
            panic!("not a problem")
        };
        assert!(
            p.message.contains(
                "user \"nobody\" is not allowed to list valkeys.database.kuberly.io in namespace \"team-a\""
            ),
            "{}",
            p.message
        );
        let hint = p.hint.unwrap_or_default();
        assert!(
            hint.contains("--verb=list --resource=valkeys.database.kuberly.io"),
            "{hint}"
        );
        assert!(hint.contains("--user=nobody"), "{hint}");
    }

    #[test]
    fn a_404_without_a_status_is_an_unknown_path() {
        let err = status(404, "Failed to parse error data", "404 page not found");
        let call = Call::new::<Valkey>("get").name("x");
        assert!(matches!(
            diagnose(&err, &call, &target()),
            Diagnosis::UnknownPath
        ));
        let err = status(404, "NotFound", "valkeys \"x\" not found");
        assert!(matches!(
            diagnose(&err, &call, &target()),
            Diagnosis::NotFound
        ));
    }

    #[test]
    fn api_user_is_read_from_the_message() {
        assert_eq!(
            api_user(r#"User "system:anonymous" cannot get"#).as_deref(),
            Some("system:anonymous")
        );
        assert_eq!(api_user("no user here"), None);
    }
}
