//! A connection to the cluster the global flags select, and the translation of its errors.

use std::time::Duration;

use anyhow::anyhow;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use valkey_core::api::Valkey;
use valkey_core::api::names;

use crate::cli::GlobalArgs;
use crate::diagnose::{self, Call, Diagnosis, Target};
use crate::error::Problem;
use crate::kubeconfig::{self, Source};

/// The field manager of every write the plugin makes.
pub const FIELD_MANAGER: &str = "kubectl-valkey";

pub struct Session {
    pub client: Client,
    /// The namespace commands work in (`-n`, else the context's, else "default").
    pub namespace: String,
    pub target: Target,
    config: Config,
}

impl Session {
    /// Reads the kubeconfig and builds a client. Nothing is sent until the first request.
    pub async fn connect(global: &GlobalArgs) -> anyhow::Result<Self> {
        let (kubeconfig, source) = kubeconfig::load(global)?;
        let (mut config, context) = match kubeconfig {
            Some(kc) => from_kubeconfig(kc, &source, global).await?,
            None => (in_cluster()?, None),
        };
        if let Some(user) = &global.as_user {
            config.auth_info.impersonate = Some(user.clone());
        }
        if !global.as_group.is_empty() {
            config.auth_info.impersonate_groups = Some(global.as_group.clone());
        }
        let timeout = global.request_timeout.filter(|t| !t.is_zero());
        if let Some(t) = timeout {
            config.connect_timeout = Some(t);
            config.read_timeout = Some(t);
            config.write_timeout = Some(t);
        }
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let target = Target {
            server: config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_owned(),
            context,
            impersonating: global.as_user.clone(),
            timeout,
        };
        let client = build_client(config.clone(), &target)?;
        Ok(Self {
            client,
            namespace,
            target,
            config,
        })
    }

    /// A client for long-lived streams (log follow, exec sessions, watches): no read timeout,
    /// since a quiet stream is not a dead server.
    pub fn streaming_client(&self) -> anyhow::Result<Client> {
        let mut config = self.config.clone();
        config.read_timeout = None;
        build_client(config, &self.target)
    }

    pub fn valkeys(&self) -> Api<Valkey> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// A call in this session's namespace, for [`Session::explain`].
    pub fn call<K: Resource<DynamicType = ()>>(&self, verb: &'static str) -> Call {
        Call::new::<K>(verb).namespace(Some(&self.namespace))
    }

    /// Turns a failed request into an error that says what to do. May ask the cluster more
    /// (whether the Valkey API exists, which instances do) to say it.
    pub async fn explain(&self, err: kube::Error, call: Call) -> anyhow::Error {
        let is_valkey = call.plural == Valkey::plural(&());
        match diagnose::diagnose(&err, &call, &self.target) {
            Diagnosis::Problem(problem) => anyhow!(problem),
            Diagnosis::UnknownPath if is_valkey && !self.valkey_api_installed().await => {
                anyhow!(self.not_installed())
            }
            Diagnosis::UnknownPath => anyhow!(Problem::new(format!(
                "cannot {}: the API server at {} does not serve {}",
                call.describe(),
                self.target.server,
                call.resource
            ))),
            Diagnosis::NotFound if is_valkey => anyhow!(self.valkey_not_found(&call).await),
            Diagnosis::NotFound => anyhow!(Problem::new(format!(
                "cannot {}: it does not exist",
                call.describe()
            ))),
        }
    }

    /// `Ok(value)`, or the explained error.
    pub async fn check<T>(&self, result: Result<T, kube::Error>, call: Call) -> anyhow::Result<T> {
        match result {
            Ok(value) => Ok(value),
            Err(err) => Err(self.explain(err, call).await),
        }
    }

    /// Gets the Valkey `name` of the session's namespace.
    pub async fn get_valkey(&self, name: &str) -> anyhow::Result<Valkey> {
        let result = self.valkeys().get(name).await;
        self.check(result, self.call::<Valkey>("get").name(name))
            .await
    }

    /// Sets the annotation `key` of the Valkey `name` to `value`: how the plugin asks the
    /// operator for something (a switchover, a restart). A merge patch as the plugin's field
    /// manager; a failure is explained.
    pub async fn annotate_valkey(&self, name: &str, key: &str, value: &str) -> anyhow::Result<()> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        let result = self
            .valkeys()
            .patch(name, &params, &Patch::Merge(&patch))
            .await;
        self.check(result, self.call::<Valkey>("patch").name(name))
            .await
            .map(|_| ())
    }

    /// The pods of the instance `name` (selected by its labels), in any order.
    pub async fn instance_pods(&self, name: &str) -> anyhow::Result<Vec<Pod>> {
        let params = ListParams::default().labels(&names::instance_selector(name));
        let result = self.api::<Pod>().list(&params).await;
        Ok(self.check(result, self.call::<Pod>("list")).await?.items)
    }

    /// Whether the API server serves the Valkey resource (i.e. the CRD is installed). Errors
    /// count as installed: only a clear "not there" blames the installation.
    pub async fn valkey_api_installed(&self) -> bool {
        let api_version = Valkey::api_version(&());
        match self.client.list_api_group_resources(&api_version).await {
            Ok(list) => list.resources.iter().any(|r| r.name == Valkey::plural(&())),
            Err(kube::Error::Api(status)) => status.code != 404,
            Err(_) => true,
        }
    }

    pub fn not_installed(&self) -> Problem {
        Problem::new(format!(
            "the Valkey API ({}.{}) is not installed on the cluster at {}: the operator is not installed",
            Valkey::plural(&()),
            Valkey::group(&()),
            self.target.server
        ))
        .hint("run `kubectl valkey install` (needs cluster-admin rights), then try again")
    }

    async fn valkey_not_found(&self, call: &Call) -> Problem {
        let name = call.name.clone().unwrap_or_default();
        let namespace = call
            .namespace
            .clone()
            .unwrap_or_else(|| self.namespace.clone());
        let problem = Problem::new(format!(
            "Valkey {name:?} not found in namespace {namespace:?}"
        ));
        let existing = Api::<Valkey>::namespaced(self.client.clone(), &namespace)
            .list_metadata(&Default::default())
            .await;
        match existing {
            Ok(list) if list.items.is_empty() => problem.hint(format!(
                "there is no Valkey in namespace {namespace:?}; `kubectl valkey list -A` lists every namespace"
            )),
            Ok(list) => {
                let names: Vec<String> = list
                    .items
                    .iter()
                    .filter_map(|v| v.metadata.name.clone())
                    .collect();
                problem.hint(format!(
                    "instances in namespace {namespace:?}: {}",
                    names.join(", ")
                ))
            }
            Err(_) => problem.hint("`kubectl valkey list -A` lists the instances you may see"),
        }
    }
}

async fn from_kubeconfig(
    kubeconfig: Kubeconfig,
    source: &Source,
    global: &GlobalArgs,
) -> Result<(Config, Option<String>), Problem> {
    let context = kubeconfig::context_name(&kubeconfig, global);
    let options = KubeConfigOptions {
        context: global.context.clone(),
        cluster: global.cluster.clone(),
        user: global.user.clone(),
    };
    match Config::from_custom_kubeconfig(kubeconfig.clone(), &options).await {
        Ok(config) => Ok((config, context)),
        Err(err) => Err(kubeconfig::explain(&err, &kubeconfig, source)),
    }
}

fn in_cluster() -> Result<Config, Problem> {
    Config::incluster().map_err(|e| {
        Problem::new(format!(
            "no kubeconfig found, and the in-cluster service account is not usable: {e}"
        ))
        .hint("point KUBECONFIG (or --kubeconfig) at the kubeconfig of your cluster")
    })
}

fn build_client(config: Config, target: &Target) -> anyhow::Result<Client> {
    Client::try_from(config).map_err(|err| {
        let mut call = Call::dynamic("connect to", "", "");
        call.resource = "the cluster".to_owned();
        match diagnose::diagnose(&err, &call, target) {
            Diagnosis::Problem(problem) => anyhow!(problem),
            _ => anyhow!(Problem::new(format!(
                "cannot set up a client for {}: {err}",
                target.server
            ))),
        }
    })
}

/// Bounds a request that should be quick even when no `--request-timeout` was given (e.g. the
/// operator lookup of `version`).
pub async fn within<T>(
    limit: Duration,
    future: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Option<Result<T, kube::Error>> {
    tokio::time::timeout(limit, future).await.ok()
}
