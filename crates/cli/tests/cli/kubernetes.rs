//! The Kubernetes manifests (`deploy/kubernetes`, issue 36, decision 0025) render with `kubectl
//! kustomize` and say what the deployment needs: a scheduler with a standby that runs no attempts,
//! workers, the HTTP API behind a Service with its health probes, the spec from a ConfigMap, the
//! state and lake only from a Secret the folder does not hold, and every container locked down.
//! What this does not show: that they run on a real cluster (docs/kubernetes.md says so).

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// The rendered objects, as JSON (kustomize writes YAML; Python's `yaml` reads it).
fn rendered(test: &str) -> Option<Vec<Value>> {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes");
    let Ok(out) = Command::new("kubectl").arg("kustomize").arg(&folder).output() else {
        tidegate_testkit::service_missing(test, "kubectl (Debian's kubernetes-client)");
        return None;
    };
    assert!(out.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&out.stderr));
    let mut python = Command::new("python3")
        .args(["-c", "import sys, json, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    std::io::Write::write_all(&mut python.stdin.take().expect("stdin"), &out.stdout).expect("the YAML goes in");
    let json = python.wait_with_output().expect("python3 ends");
    assert!(json.status.success(), "python3 could not read the YAML (PyYAML)");
    Some(serde_json::from_slice(&json.stdout).expect("JSON"))
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name).unwrap_or_else(|| {
        panic!("no {kind} {name} among {:?}", objects.iter().map(|o| &o["metadata"]["name"]).collect::<Vec<_>>())
    })
}

fn args(deployment: &Value) -> Vec<String> {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    container["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("text").to_owned()).collect()
}

#[test]
fn the_kubernetes_manifests_render_a_locked_down_scheduler_workers_and_api_with_secrets_kept_out() {
    let Some(objects) = rendered("the_kubernetes_manifests_render") else { return };
    assert!(objects.iter().all(|o| o["kind"] != "Secret"), "the folder holds no Secret");
    let text = serde_json::to_string(&objects).expect("JSON");
    for secret_looking in ["postgres://", "s3://", "AWS_SECRET_ACCESS_KEY"] {
        assert!(!text.contains(secret_looking), "{secret_looking} written into a manifest");
    }

    let scheduler = named(&objects, "Deployment", "tidegate-scheduler");
    assert_eq!(scheduler["spec"]["replicas"], 2, "a standby beside the holder of the scheduler role");
    assert!(args(scheduler).windows(2).any(|w| w == ["--workers", "0"]), "{:?}", args(scheduler));
    let worker = named(&objects, "Deployment", "tidegate-worker");
    assert_eq!(args(worker)[2], "worker");
    let api = named(&objects, "Deployment", "tidegate-api");
    assert!(args(api).contains(&"--no-scheduler".to_owned()) && args(api).contains(&"--http".to_owned()));
    let probes = &api["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(probes["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(probes["readinessProbe"]["httpGet"]["path"], "/readyz");
    let service = named(&objects, "Service", "tidegate-api");
    assert_eq!(service["spec"]["selector"]["app.kubernetes.io/name"], "tidegate-api");
    assert_eq!(service["spec"]["sessionAffinity"], "ClientIP", "UI sessions live in the pod that began them");

    // The spec from the ConfigMap the folder's tidegate.toml makes, and it validates.
    let config = objects.iter().find(|o| o["kind"] == "ConfigMap").expect("the workspace's ConfigMap");
    let spec = config["data"]["tidegate.toml"].as_str().expect("tidegate.toml");
    let dir = tidegate_testkit::TestWorkspace::new(spec);
    crate::common::ok(dir.path(), &["validate"]);

    for deployment in [scheduler, worker, api] {
        let pod = &deployment["spec"]["template"]["spec"];
        let name = &deployment["metadata"]["name"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        let container = &pod["containers"][0];
        let args = args(deployment);
        assert_eq!(args[..2], ["-C", "/workspace"], "{name}");
        assert_eq!(container["envFrom"][0]["secretRef"]["name"], "tidegate", "{name}: state and lake from the Secret");
        assert!(container.get("env").is_none(), "{name}: no variable written into the manifest");
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]), "{name}");
        for limit in ["requests", "limits"] {
            assert!(container["resources"][limit]["memory"].is_string(), "{name}: resources.{limit}");
        }
        let mounts: Vec<&str> = container["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| m["mountPath"].as_str())
            .collect();
        assert!(mounts.contains(&"/workspace/tidegate.toml") && mounts.contains(&"/tmp"), "{name}: {mounts:?}");
    }
}
