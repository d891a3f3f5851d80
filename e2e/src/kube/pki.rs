//! The cluster's certificates, made by the `openssl` command: one CA ─► a serving certificate for the
//! API server, one client certificate per identity, the service-account signing key.
//!
//! ```text
//! pki/ca.{crt,key}                 the cluster CA (also signs the controller-manager's CSRs)
//! pki/apiserver.{crt,key}          SANs: the API server's address, 10.96.0.1, 127.0.0.1, kubernetes.default…
//! pki/<identity>.{crt,key}         CN = user, O = group (admin: system:masters; node-a: system:node:node-a
//!                                  in system:nodes; kube-proxy: system:kube-proxy; …)
//! pki/service-account.{key,pub}    signs and verifies service-account tokens
//! ```
//!
//! Keys are P-256 (fast to make); every certificate lasts 7 days (a lab lives for minutes).

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    command,
    error::{LabError, Result},
};

/// How long certificates last.
const DAYS: &str = "7";

/// One client identity: a file stem, the user (CN) and the group (O).
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    /// File stem and kubeconfig name.
    pub name: &'static str,
    /// The user name (CN).
    pub user: &'static str,
    /// The group (O), if any.
    pub group: Option<&'static str>,
}

/// The fixed identities of a cluster (nodes are added per node).
pub const IDENTITIES: [Identity; 5] = [
    Identity {
        name: "admin",
        user: "switchyard-lab-admin",
        group: Some("system:masters"),
    },
    Identity {
        name: "controller-manager",
        user: "system:kube-controller-manager",
        group: None,
    },
    Identity {
        name: "scheduler",
        user: "system:kube-scheduler",
        group: None,
    },
    Identity {
        name: "kube-proxy",
        user: "system:kube-proxy",
        group: None,
    },
    // The API server's identity towards kubelets (exec, logs, port-forward).
    Identity {
        name: "apiserver-kubelet-client",
        user: "kube-apiserver-kubelet-client",
        group: Some("system:masters"),
    },
];

/// The certificate files of one cluster.
#[derive(Clone, Debug)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Makes the CA, the API server's serving certificate (for `apiserver_ip`), the fixed identities,
    /// one identity per node, and the service-account key pair, under `dir`.
    pub fn create(dir: &Path, apiserver_ip: Ipv4Addr, nodes: &[String]) -> Result<Pki> {
        std::fs::create_dir_all(dir).map_err(|source| LabError::File {
            action: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        pki.openssl(&[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            DAYS,
            "-subj",
            "/CN=switchyard-lab-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])?;
        let sans = format!(
            "subjectAltName=IP:{apiserver_ip},IP:10.96.0.1,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,\
             DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
        );
        pki.leaf("apiserver", "kube-apiserver", None, Some(&sans))?;
        for identity in IDENTITIES {
            pki.leaf(identity.name, identity.user, identity.group, None)?;
        }
        for node in nodes {
            pki.leaf(node, &format!("system:node:{node}"), Some("system:nodes"), None)?;
        }
        pki.openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            "service-account.key",
        ])?;
        pki.openssl(&[
            "pkey",
            "-in",
            "service-account.key",
            "-pubout",
            "-out",
            "service-account.pub",
        ])?;
        Ok(pki)
    }

    /// The files of a cluster made before.
    pub fn open(dir: &Path) -> Pki {
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    /// `<dir>/<name>`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// An identity's certificate and key.
    pub fn pair(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.path(&format!("{name}.crt")),
            self.path(&format!("{name}.key")),
        )
    }

    fn leaf(&self, name: &str, user: &str, group: Option<&str>, sans: Option<&str>) -> Result<()> {
        let subject = match group {
            Some(group) => format!("/O={group}/CN={user}"),
            None => format!("/CN={user}"),
        };
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        self.openssl(&[
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &subject,
        ])?;
        let extensions = self.path(&format!("{name}.ext"));
        let mut text = String::from(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        );
        if let Some(sans) = sans {
            text.push_str(sans);
            text.push('\n');
        }
        std::fs::write(&extensions, text).map_err(|source| LabError::File {
            action: "writing",
            path: extensions.clone(),
            source,
        })?;
        let extfile = extensions.display().to_string();
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            DAYS,
            "-extfile",
            &extfile,
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<()> {
        command::run(Command::new("openssl").args(args).current_dir(&self.dir), None).map(drop)
    }
}
