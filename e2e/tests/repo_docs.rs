//! What a newcomer reads before running anything: `make help` lists every documented Makefile target,
//! every relative link in the repository's Markdown points at a file that is in the repository, and the
//! README's first screen, commands and sample output are what they say (its commands run as written).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

#[cfg(test)] // marks the helper as test code for clippy's allow-unwrap-in-tests
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn make_help_lists_every_documented_target() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let documented: Vec<&str> = makefile
        .lines()
        .filter(|line| line.contains(" ## ") && !line.starts_with(['\t', ' ', '#']))
        .filter_map(|line| line.split(':').next())
        .collect();
    assert!(documented.contains(&"e2e"), "{documented:?}");
    let out = Command::new("make")
        .args(["-s", "help"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = help.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(listed, documented, "make help:\n{help}");
}

/// Markdown files of the repository (not build output).
#[cfg(test)]
fn markdown(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                markdown(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

#[test]
fn relative_links_in_markdown_point_into_the_repository() {
    let root = root().canonicalize().unwrap();
    let mut files = Vec::new();
    markdown(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")));
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        // Markdown links, and paths in backticks written relative to the file (`../x.md`).
        let links = text.match_indices("](").map(|(i, _)| {
            text.split_at(i + 2)
                .1
                .split([')', '#', ' '])
                .next()
                .unwrap_or_default()
        });
        let quoted = text
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|quoted| quoted.starts_with("../") && !quoted.contains(char::is_whitespace));
        for target in links.chain(quoted) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let resolved = file.parent().unwrap().join(target);
            let inside = resolved.canonicalize().is_ok_and(|path| path.starts_with(&root));
            if !inside {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to nothing in the repository:\n{}",
        broken.join("\n")
    );
}

/// The Dockerfiles and `make image` (scripts/image/build.sh) must give the same image: the same base
/// script for the same component, the binary at the same path, the same user and entrypoint.
#[test]
fn the_dockerfiles_build_what_make_image_builds() {
    let build = std::fs::read_to_string(root().join("scripts/image/build.sh")).unwrap();
    for (component, user) in [("agent", "0:0"), ("controller", "65532:65532")] {
        let dockerfile = std::fs::read_to_string(root().join(format!("Dockerfile.{component}"))).unwrap();
        let binary = format!("/usr/local/bin/switchyard-{component}");
        for needle in [
            format!("rootfs.sh {component} "),
            "FROM scratch".to_owned(),
            format!("COPY --from=builder /out/switchyard-{component} {binary}"),
            format!("USER {user}"),
            format!("ENTRYPOINT [\"{binary}\"]"),
            "CARGO_PROFILE_RELEASE_STRIP=symbols".to_owned(),
        ] {
            assert!(
                dockerfile.contains(&needle),
                "Dockerfile.{component} lacks {needle:?}"
            );
        }
        for needle in [
            format!("base_tar {component})"),
            format!("\"$files{binary}\""),
            format!("--config.entrypoint={binary} --config.cmd=--help --config.user={user}"),
        ] {
            assert!(
                build.contains(&needle),
                "build.sh lacks {needle:?} for {component}"
            );
        }
    }
}

/// `make demo` and `make demo-cluster` show cargo's progress while they build (issue 45: minutes of
/// silence), and say what they are building first.
#[test]
fn the_demo_targets_show_their_build() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    for target in ["demo:", "demo-cluster:"] {
        let recipe: Vec<&str> = makefile
            .split(&format!("\n{target}"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {target} target"))
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('\t'))
            .collect();
        let build = recipe
            .iter()
            .find(|l| l.contains("build --bins"))
            .unwrap_or_else(|| panic!("{target} builds nothing: {recipe:?}"));
        assert!(!build.contains(" -q"), "{target} builds quietly: {build}");
        assert!(
            recipe
                .iter()
                .any(|l| l.contains("echo") && l.contains("first build takes")),
            "{target}: {recipe:?}"
        );
    }
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// The fenced blocks that follow a line starting with `marker` (an HTML comment), with the byte range
/// of each block's body.
#[cfg(test)]
fn blocks_after(text: &str, marker: &str) -> Vec<(std::ops::Range<usize>, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(marker) {
        let at = from + at;
        let fence = text[at..].find("```").unwrap() + at;
        let body = text[fence..].find('\n').unwrap() + fence + 1;
        let end = text[body..].find("```").unwrap() + body;
        out.push((body..end, text[body..end].to_string()));
        from = end;
    }
    out
}

/// Issue 45: the first screen says what Switchyard is, then the two commands, each on one line with
/// what it needs and how long it takes; nothing before them about packages or downloads; no path
/// outside the repository anywhere in it.
#[test]
fn the_readme_starts_with_what_switchyard_is_and_the_two_commands() {
    let text = readme();
    let first_screen: Vec<&str> = text.lines().take(24).collect();
    let first_screen = first_screen.join("\n");
    let what = first_screen
        .find("does kube-proxy's job")
        .expect("what Switchyard is");
    for command in ["make demo   #", "make test   #"] {
        let at = first_screen
            .find(command)
            .unwrap_or_else(|| panic!("{command} not on the first screen"));
        assert!(what < at, "the commands come after what Switchyard is");
        let line = first_screen[at..].lines().next().unwrap();
        assert!(
            line.contains("root") && line.contains("min"),
            "{command}: needs and time: {line}"
        );
    }
    assert!(!first_screen[..what].contains("apt"), "{first_screen}");
    assert!(
        text.lines().count() < 120,
        "the README is short; the rest is in docs/"
    );
    assert!(
        !text.contains("shared/") && !text.contains("](../"),
        "a path outside the repository"
    );
    assert!(text.contains("docs/reliability.md#disk") && text.contains("**Disk.**"));
}

/// Every command of the README's tested blocks runs as written, from the repository's root, with the
/// binaries `make demo` (or `make build`) leaves in target/debug/; the exit codes the README lists are
/// the binaries' own.
#[test]
fn the_readmes_commands_run_as_written() {
    let text = readme();
    let blocks = blocks_after(&text, "<!-- run as written");
    assert!(!blocks.is_empty(), "no tested block in the README");
    for binary in ["switchyard-controller", "switchyard-agent"] {
        assert!(
            root().join("target/debug").join(binary).exists(),
            "target/debug/{binary} is missing: run `make build` (or the whole `make test`) first"
        );
    }
    let mut ran = 0;
    for (_, block) in blocks {
        for line in block
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        {
            let out = Command::new("bash")
                .args(["-o", "pipefail", "-c", line])
                .current_dir(root())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{line}\nexit {:?}\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.stdout.is_empty(), "{line} printed nothing");
            ran += 1;
        }
    }
    assert!(ran >= 3, "{ran} commands");
    // Every binary the README names outside prose is named as `make demo` leaves it.
    for (i, _) in text
        .match_indices("switchyard-controller ")
        .chain(text.match_indices("switchyard-agent "))
    {
        let before = &text[..i];
        if before.ends_with("target/debug/") {
            continue;
        }
        let line = text[before.rfind('\n').map_or(0, |n| n + 1)..]
            .lines()
            .next()
            .unwrap_or_default();
        assert!(
            !line.starts_with("target/") && !line.starts_with("switchyard-"),
            "{line}"
        );
    }
    assert!(
        text.contains(switchyard_process::exit::TABLE),
        "the README's exit codes are not process/src/exit.rs's TABLE"
    );
}

/// The rows `make demo` prints, as far as they do not depend on the run: each node's live plan, its
/// views' slices, and what its agent reports after applying them with iptables (the rules its chains
/// hold, counted from the render); LAST SYNC is a sample time.
fn demo_table() -> String {
    use switchyard_agent::backend::HostFacts;
    use switchyard_agent::wiring::render_text::render_text;
    use switchyard_api::{
        Backend, NodeForwardingPlanStatus, ObservedSlices, PlanCondition, compose, conditions,
    };
    use switchyard_controller::output::{Written, table, written_objects};
    use switchyard_controller::{Config, input, planner::Planner};

    let config = Config::load(&root().join("examples/controller-config.yaml")).unwrap();
    let loaded = input::load_files(&[root().join("examples/cluster.yaml")]).unwrap();
    let planner = Planner::build(&loaded.snapshot, &config).unwrap();
    let written = written_objects(&planner);
    let facts = HostFacts {
        random_fully: true,
        tcp_be_liberal: false,
        local_addrs: Vec::new(),
    };
    let mut rows = Vec::new();
    for object in &written {
        let Written::Plan(plan) = object else { continue };
        let node = plan.metadata.name.clone().unwrap();
        let slices: Vec<(&str, &str)> = written
            .iter()
            .filter_map(|w| match w {
                Written::Slice(s) if plan.spec.views.contains(&s.spec.view) => {
                    Some((s.metadata.name.as_deref().unwrap(), s.spec.revision.as_str()))
                }
                _ => None,
            })
            .collect();
        let composed = planner.composed(&node).unwrap().unwrap().spec;
        let rendered = render_text(Backend::Iptables, &composed, &Default::default(), &facts, None);
        let rules = rendered.lines().filter(|l| l.starts_with("-A SWYD-")).count() as u64;
        let mut plan = plan.clone();
        plan.status = Some(NodeForwardingPlanStatus {
            observed_revision: Some(plan.spec.revision.clone()),
            observed_slices: Some(ObservedSlices {
                count: slices.len() as u32,
                digest: compose::slices_digest(slices.iter().copied()),
            }),
            conditions: vec![PlanCondition {
                type_: conditions::APPLIED.into(),
                status: conditions::status::TRUE.into(),
                reason: conditions::reasons::SYNCED.into(),
                message: String::new(),
                last_transition_time: None,
            }],
            services: Some(composed.services.len() as u32),
            endpoints: Some(composed.services.iter().map(|e| e.endpoints.len() as u32).sum()),
            rules: Some(rules),
            last_sync_time: Some("2026-12-07T10:00:00Z".into()),
            ..Default::default()
        });
        rows.push(serde_json::to_value(&plan).unwrap());
    }
    table(&rows, false)
}

/// The sample of `make demo`'s table in the README is what the planner and the iptables renderer give
/// for the example today (`README_UPDATE=1` writes it there).
#[test]
fn the_readmes_sample_output_is_current() {
    let text = readme();
    let blocks = blocks_after(&text, "<!-- checked against the planner");
    let [(range, shown)] = blocks.as_slice() else {
        panic!("one checked sample in the README, found {}", blocks.len());
    };
    let want = demo_table();
    if std::env::var("README_UPDATE").as_deref() == Ok("1") {
        let mut updated = text.clone();
        updated.replace_range(range.clone(), &want);
        std::fs::write(root().join("README.md"), updated).unwrap();
        return;
    }
    assert_eq!(
        shown, &want,
        "the README's sample of `make demo` is stale: README_UPDATE=1 cargo test -p switchyard-e2e --test repo_docs rewrites it"
    );
}

/// The krew manifest template names the plugin's binary for every platform and the crate's version,
/// and the plugin answers `--help` under that name.
#[test]
fn the_krew_manifest_matches_the_plugin() {
    let text = std::fs::read_to_string(root().join("controller/krew/switchyard.yaml")).unwrap();
    let manifest: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(
        manifest["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(manifest["metadata"]["name"], "switchyard", "kubectl switchyard");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(manifest["spec"]["version"], version.as_str());
    let platforms = manifest["spec"]["platforms"].as_array().unwrap();
    assert!(!platforms.is_empty());
    for platform in platforms {
        assert_eq!(platform["bin"], "kubectl-switchyard", "{platform}");
        let uri = platform["uri"].as_str().unwrap();
        assert!(uri.contains(&version), "{uri} names {version}");
        assert_eq!(platform["sha256"].as_str().unwrap().len(), 64, "{platform}");
    }
    let plugin = root().join("target/debug/kubectl-switchyard");
    assert!(
        plugin.exists(),
        "{} is missing: run `make build` first",
        plugin.display()
    );
    let help = Command::new(&plugin).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for command in ["status", "audit", "plan", "explain", "top"] {
        assert!(
            help.contains(command),
            "kubectl switchyard --help lists {command}:\n{help}"
        );
    }
    assert!(help.contains("kubectl switchyard"), "{help}");
}
