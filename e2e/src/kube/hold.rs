//! A lab node's mount namespace, held open: `switchyard-lab kube hold --bind SRC:DST…`, started by
//! `nsenter --net=<node netns> unshare --mount --propagation slave`, binds each SRC over DST, prints
//! "ready" and waits to be killed.
//!
//! ```text
//! host mount namespace ──(slave: host mounts still propagate in)──► node mount namespace
//!   /var/lib/kubelet   ◄─ bind ─ <lab>/nodes/node-a/kubelet      (and containerd, CNI, logs, the
//!   /run/xtables.lock  ◄─ bind ─ <lab>/nodes/node-a/xtables.lock   agent's /var/lib/switchyard …)
//! containerd, kubelet, kube-proxy: `nsenter -t <holder> -m -n` ─► the node's own default paths
//! ```
//!
//! Nothing mounted here is seen by the host, and everything goes when the last process of the node
//! exits: killing a node's processes is its whole unmount.

use std::path::PathBuf;

use nix::mount::{MsFlags, mount};

use crate::error::{LabError, Result};

/// One bind: what to show (SRC) where (DST).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The lab's own file or directory.
    pub source: PathBuf,
    /// The default path it is shown at inside the node.
    pub target: PathBuf,
}

impl Bind {
    /// `SRC:DST` as given on the command line.
    pub fn parse(text: &str) -> std::result::Result<Bind, String> {
        let (source, target) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?} is not SRC:DST"))?;
        Ok(Bind {
            source: PathBuf::from(source),
            target: PathBuf::from(target),
        })
    }

    /// The command-line form.
    pub fn to_arg(&self) -> String {
        format!("{}:{}", self.source.display(), self.target.display())
    }
}

/// Binds every `binds` entry (in this process's mount namespace, which must be the node's own),
/// prints "ready", then sleeps until killed.
pub fn hold(binds: &[Bind]) -> Result<()> {
    for bind in binds {
        mount(
            Some(&bind.source),
            &bind.target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|errno| LabError::Kube {
            what: format!("binding {} over {}", bind.source.display(), bind.target.display()),
            detail: errno.to_string(),
        })?;
    }
    println!("ready");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_round_trip_through_the_command_line() {
        let bind = Bind::parse("/tmp/lab/kubelet:/var/lib/kubelet").unwrap();
        assert_eq!(bind.target, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(Bind::parse(&bind.to_arg()).unwrap(), bind);
        assert!(Bind::parse("nocolon").is_err());
    }
}
