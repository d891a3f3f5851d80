//! What a newcomer reads before running anything: `make help` lists every documented Makefile target,
//! and every relative link in the repository's Markdown points at a file that is in the repository.

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
