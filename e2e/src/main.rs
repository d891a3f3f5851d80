//! `switchyard-lab`: command line ─► the lab library (bring labs up and down, clean up, serve, probe).
//!
//! ```text
//! up --cluster FILE [--keep]   build a lab, print its topology; stay up until Ctrl-C/SIGTERM (then tear
//!                              down), or with --keep leave it up and print its id
//! down ID                      tear down a kept lab
//! gc [--all]                   remove what killed runs left: labs, clusters, scratch folders (--all: every
//!                              lab, live or kept)
//! serve …                      the backend run inside each pod namespace
//! probe …                      one or more probes, JSON on stdout (exit 0 when every probe was answered)
//! balance …                    the outside load balancer run inside <id>-balancer (JSON events on stdout)
//! demo [--cluster F] [--keep]  Switchyard on the example cluster: plans, agents, their status, traffic
//! ```

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use switchyard_e2e::{
    ClusterDescription, Lab, LabOptions, Proto, install_teardown_on_signal, options, probe, serve, teardown,
};

/// Exit status of `probe` when a probe was not answered.
const NOT_ANSWERED: u8 = 3;

#[derive(Parser)]
#[command(
    name = "switchyard-lab",
    version,
    about = "A virtual multi-node cluster in network namespaces"
)]
struct Cli {
    /// Directory holding lab state (manifests, logs, plans).
    #[arg(long, global = true, env = "SWITCHYARD_LAB_DIR", default_value = options::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a lab from a cluster description (Nodes, Services, EndpointSlices as YAML).
    Up {
        /// The cluster description.
        #[arg(long)]
        cluster: PathBuf,
        /// Leave the lab up and print its id (remove it with `down ID`).
        #[arg(long)]
        keep: bool,
        /// The external client's address on the fabric.
        #[arg(long)]
        client_ip: Option<std::net::Ipv4Addr>,
        /// The node the client routes service addresses through (default: the first node).
        #[arg(long)]
        gateway: Option<String>,
    },
    /// Tear down a lab left up with `up --keep`.
    Down {
        /// The lab id (e.g. sy1a2b).
        id: String,
    },
    /// Remove what killed runs left: labs and clusters whose owning process is gone (or, kept by hand,
    /// with nothing running), logs of failed labs older than a day, and scratch folders of processes
    /// that are gone. Never a lab whose owner or processes still run.
    #[command(alias = "cleanup")]
    Gc {
        /// Also remove live and kept labs, all kept logs, and any namespace named like a lab's.
        #[arg(long)]
        all: bool,
    },
    /// Serve as a lab backend (run inside a pod namespace by the lab).
    Serve {
        /// The name to answer with.
        #[arg(long)]
        name: String,
        /// The address to bind.
        #[arg(long, default_value = "0.0.0.0")]
        bind: std::net::IpAddr,
        /// TCP ports to listen on.
        #[arg(long)]
        tcp: Vec<u16>,
        /// UDP ports to listen on.
        #[arg(long)]
        udp: Vec<u16>,
        /// TCP ports to serve as an echo: the answer line, then every byte back until the peer closes.
        #[arg(long)]
        echo: Vec<u16>,
    },
    /// Run as the lab's outside load balancer (inside its namespace): health-check every node's
    /// kube-proxy port each interval and spread new TCP connections over the healthy nodes' NodePort,
    /// one JSON event per line on stdout (health changes, each connection's node).
    Balance {
        /// ADDR:PORT=NODEPORT: listen at ADDR:PORT, forward to NODEPORT on the picked node (repeatable).
        #[arg(long = "frontend", required = true)]
        frontends: Vec<switchyard_e2e::balance::Frontend>,
        /// The nodes' addresses, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<std::net::Ipv4Addr>,
        /// The port whose /healthz is checked on every node (kube-proxy's).
        #[arg(long, default_value_t = switchyard_e2e::balance::HEALTH_PORT)]
        health_port: u16,
        /// How often each node is checked (e.g. 1s, 500ms).
        #[arg(long, default_value = "1s", value_parser = switchyard_agent::cli::parse_duration)]
        interval: Duration,
    },
    /// Run the node agent (`switchyard-agent …`); the lab starts agents through this so tests need no other
    /// binary.
    #[command(disable_help_flag = true)]
    Agent {
        /// Arguments for switchyard-agent.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run Switchyard on a cluster description in a lab: plans, one agent per node (plan and status
    /// files; no API server), their status in `kubectl get nfp`'s columns, and traffic checks (the
    /// example cluster's by default).
    Demo {
        /// The cluster description.
        #[arg(long, default_value = "examples/cluster.yaml")]
        cluster: PathBuf,
        /// The controller configuration.
        #[arg(long, default_value = "examples/controller-config.yaml")]
        config: PathBuf,
        /// Leave the lab up at the end.
        #[arg(long)]
        keep: bool,
    },
    /// The same through a real API server (a cluster without Switchyard, or a bare kube-apiserver): apply
    /// crds/, the example's objects, the controller and one agent per lab node against it, `kubectl get
    /// nfp`, traffic checks, a change, and everything created removed again.
    DemoCluster {
        /// The cluster description.
        #[arg(long, default_value = "examples/cluster.yaml")]
        cluster: PathBuf,
        /// The controller configuration.
        #[arg(long, default_value = "examples/controller-config.yaml")]
        config: PathBuf,
        /// The kubeconfig of the API server.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: PathBuf,
        /// The CRD directory.
        #[arg(long, default_value = "crds")]
        crds: PathBuf,
    },
    /// A real Kubernetes cluster in the lab (control plane, kubelets with containerd, no proxy).
    Kube {
        #[command(subcommand)]
        command: KubeCmd,
    },
    /// Probe a destination and print the result as JSON.
    Probe {
        /// tcp or udp.
        proto: Proto,
        /// The destination, IP:PORT.
        dst: SocketAddr,
        /// Probe from inside this named network namespace (default: the current one).
        #[arg(long)]
        netns: Option<String>,
        /// Per-probe timeout in milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// Number of probes (more than one prints counts per pod).
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
}

#[derive(Subcommand)]
enum KubeCmd {
    /// Bring a cluster up: etcd, kube-apiserver, controller-manager and scheduler, and NODES kubelets
    /// each with its own containerd (the images of --images imported), all from $SWITCHYARD_K8S_BIN.
    /// With --nodes 0: etcd and kube-apiserver only (a bare API server, as the cluster suites use).
    Up {
        /// How many nodes.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// The folder of Kubernetes binaries (../shared/k8s/unpack.sh prints one).
        #[arg(long, env = "SWITCHYARD_K8S_BIN")]
        k8s_bin: PathBuf,
        /// The OCI archives to import into every node (make image writes them there).
        #[arg(long, default_value = "target/images")]
        images: PathBuf,
        /// Leave the cluster up and print its id (remove it with `kube down ID`).
        #[arg(long)]
        keep: bool,
        /// With --keep: the process (pid) the cluster is kept for; `gc` removes it once that process is
        /// gone, however it ended (a script that starts a scratch API server passes its own `$$`).
        #[arg(long, requires = "keep")]
        bound_to: Option<u32>,
    },
    /// Tear down a cluster left up with `kube up --keep` (everything it made).
    Down {
        /// The lab id.
        id: String,
    },
    /// Hold a lab node's mount namespace: bind each SRC:DST, print "ready", wait (the lab runs this).
    #[command(hide = true)]
    Hold {
        /// SRC:DST, a bind of the node's own directory over a default path.
        #[arg(long = "bind")]
        binds: Vec<String>,
    },
    /// Relay a port on the host's loopback to an address inside a namespace (the lab runs this).
    #[command(hide = true)]
    Relay {
        /// The namespace connections are made from.
        #[arg(long)]
        netns: String,
        /// The address to connect to.
        #[arg(long)]
        to: SocketAddr,
        /// Where to listen on the host.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("switchyard-lab: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Cmd::Up {
            cluster,
            keep,
            client_ip,
            gateway,
        } => {
            install_teardown_on_signal()?;
            let mut options = LabOptions {
                state_dir: cli.state_dir,
                client_gateway: gateway,
                ..LabOptions::default()
            };
            if let Some(ip) = client_ip {
                options.client_ip = ip;
            }
            let lab = Lab::up_with(ClusterDescription::from_file(&cluster)?, options)?;
            print!("{}", lab.summary());
            if keep {
                let id = lab.keep()?;
                println!("kept lab {id}; remove it with: switchyard-lab down {id}");
                return Ok(ExitCode::SUCCESS);
            }
            println!("lab {} is up; Ctrl-C (or SIGTERM) tears it down", lab.id());
            // NB: the signal thread tears every live lab down and exits the process.
            loop {
                std::thread::park();
            }
        }
        Cmd::Agent { args } => {
            let argv = std::iter::once(std::ffi::OsString::from("switchyard-agent")).chain(args);
            Ok(switchyard_agent::cli::run_cli(argv))
        }
        Cmd::Demo {
            cluster,
            config,
            keep,
        } => {
            if !switchyard_e2e::preflight::is_root() {
                eprintln!(
                    "switchyard-lab demo: the lab builds network namespaces and needs root; run `sudo make demo`"
                );
                return Ok(ExitCode::from(2));
            }
            install_teardown_on_signal()?;
            let options = LabOptions {
                state_dir: cli.state_dir,
                ..LabOptions::default()
            };
            let demo = switchyard_e2e::demo::DemoOptions {
                cluster,
                config: Some(config),
                keep,
            };
            let failed = switchyard_e2e::demo::run(&demo, options)?;
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::DemoCluster {
            cluster,
            config,
            kubeconfig,
            crds,
        } => {
            if !switchyard_e2e::preflight::is_root() {
                eprintln!("switchyard-lab demo-cluster: the lab builds network namespaces and needs root");
                return Ok(ExitCode::from(2));
            }
            install_teardown_on_signal()?;
            let options = LabOptions {
                state_dir: cli.state_dir,
                ..LabOptions::default()
            };
            let demo = switchyard_e2e::cluster_demo::ClusterDemoOptions {
                cluster,
                config,
                kubeconfig,
                crds,
            };
            let failed = switchyard_e2e::cluster_demo::run(&demo, options)?;
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Kube { command } => run_kube(command, cli.state_dir),
        Cmd::Down { id } => {
            teardown::down(&cli.state_dir, &id)?;
            println!("lab {id} removed");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Gc { all } => {
            let report = teardown::gc(&cli.state_dir, all);
            for id in &report.removed {
                println!("removed lab {id}");
            }
            for (id, why) in &report.skipped {
                println!("left lab {id} alone: {why}");
            }
            for name in &report.strays {
                println!("removed stray namespace {name}");
            }
            for dir in &report.retired_dirs {
                println!("removed the logs of a finished lab: {}", dir.display());
            }
            for dir in &report.scratch {
                println!("removed scratch folder {}", dir.display());
            }
            for problem in &report.problems {
                eprintln!("problem: {problem}");
            }
            Ok(if report.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Serve {
            name,
            bind,
            tcp,
            udp,
            echo,
        } => {
            let config = serve::ServeConfig {
                name,
                bind,
                tcp,
                udp,
                echo,
            };
            serve::serve(&config, serve::announce_on_stdout)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Balance {
            frontends,
            nodes,
            health_port,
            interval,
        } => {
            let config = switchyard_e2e::balance::BalancerConfig {
                frontends,
                nodes,
                health_port,
                interval,
            };
            switchyard_e2e::balance::run(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Probe {
            proto,
            dst,
            netns,
            timeout_ms,
            count,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            if count == 1 {
                let result = match &netns {
                    Some(netns) => probe::probe(netns, proto, dst, timeout),
                    None => probe::probe_here(proto, dst, timeout),
                };
                println!("{}", serde_json::to_string(&result)?);
                return Ok(exit_for(result.is_answered()));
            }
            let tally = match &netns {
                Some(netns) => probe::probe_many(netns, proto, dst, count, timeout),
                None => probe::probe_many_here(proto, dst, count, timeout),
            };
            let all_answered = tally.total_answered() == count;
            println!("{}", serde_json::to_string(&tally)?);
            Ok(exit_for(all_answered))
        }
    }
}

fn run_kube(command: KubeCmd, state_dir: PathBuf) -> anyhow::Result<ExitCode> {
    use switchyard_e2e::kube::{self, K8sBinaries, KubeCluster, KubeOptions};
    match command {
        KubeCmd::Up {
            nodes,
            k8s_bin,
            images,
            keep,
            bound_to,
        } => {
            install_teardown_on_signal()?;
            let options = KubeOptions {
                nodes,
                binaries: K8sBinaries::at(&k8s_bin)?,
                // A control plane alone (the cluster suites') imports nothing.
                images: if nodes == 0 {
                    Vec::new()
                } else {
                    kube::cluster::image_archives(&images)
                },
                lab_binary: options::locate_lab_binary(),
                state_dir,
                ready_timeout: Duration::from_secs(120),
            };
            let started = std::time::Instant::now();
            let cluster = KubeCluster::up(options)?;
            println!(
                "cluster {} is up ({} nodes Ready after {:.1} s; no proxy runs yet)",
                cluster.id(),
                cluster.nodes().len(),
                started.elapsed().as_secs_f64()
            );
            println!("  export KUBECONFIG={}", cluster.admin_kubeconfig().display());
            println!(
                "  API server (for pods and nodes): {}",
                cluster.apiserver_address()
            );
            println!("  logs: {}", cluster.logs_dir().display());
            if keep {
                let id = cluster.keep(bound_to)?;
                println!("kept cluster {id}; remove it with: switchyard-lab kube down {id}");
                return Ok(ExitCode::SUCCESS);
            }
            println!("Ctrl-C (or SIGTERM) tears it down");
            loop {
                std::thread::park();
            }
        }
        KubeCmd::Down { id } => {
            teardown::down(&state_dir, &id)?;
            println!("cluster {id} removed");
            Ok(ExitCode::SUCCESS)
        }
        KubeCmd::Hold { binds } => {
            let binds = binds
                .iter()
                .map(|text| kube::hold::Bind::parse(text).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<Vec<_>>>()?;
            kube::hold::hold(&binds)?;
            Ok(ExitCode::SUCCESS)
        }
        KubeCmd::Relay { netns, to, listen } => {
            let relay = switchyard_e2e::relay::Relay::into_netns(listen, &netns, to)?;
            let addr = relay
                .listen_addr()
                .ok_or_else(|| anyhow::anyhow!("the relay has no listener"))?;
            println!("listening {addr}");
            // NB: the parent reads that one line; nothing else is printed.
            use std::io::Write as _;
            std::io::stdout().flush()?;
            loop {
                std::thread::park();
            }
        }
    }
}

fn exit_for(answered: bool) -> ExitCode {
    if answered {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(NOT_ANSWERED)
    }
}
