//! `cfg(kubeconfig)` when `KUBECONFIG` is set at build time, `cfg(k8s_bin)` when `SWITCHYARD_K8S_BIN`
//! is: the cluster e2e suites are `#[ignore]`d without them, so a test summary never counts them as
//! run when no API server (or no Kubernetes binaries to start one) was there.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kubeconfig)");
    println!("cargo::rustc-check-cfg=cfg(k8s_bin)");
    println!("cargo::rerun-if-env-changed=KUBECONFIG");
    println!("cargo::rerun-if-env-changed=SWITCHYARD_K8S_BIN");
    if std::env::var_os("KUBECONFIG").is_some() {
        println!("cargo::rustc-cfg=kubeconfig");
    }
    if std::env::var_os("SWITCHYARD_K8S_BIN").is_some() {
        println!("cargo::rustc-cfg=k8s_bin");
    }
}
