//! One durable atomic file write, for every file an agent or controller leaves for the next start.
//!
//! ```text
//! write(w) ─► <dir>/.<name>.tmp ─► fsync file ─► rename over <name> ─► fsync <dir>
//!                 └─ any failure: the temporary file is removed, <name> is untouched
//! ```
//!
//! Readers see the old content or the new one, never a part; after a crash or power loss the rename
//! has either happened whole or not at all, because both the file and its directory were synced.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes `path` atomically and durably with what `write` puts into the buffered writer it is given.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = temporary(path);
    let result = write_then_rename(path, &tmp, write);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`] of bytes held in memory.
pub fn write_atomic_bytes(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}

fn write_then_rename(
    path: &Path,
    tmp: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let mut writer = BufWriter::new(File::create(tmp)?);
    write(&mut writer)?;
    let file = writer.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(tmp, path)?;
    // The rename is durable only once the directory that holds it is synced.
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// `<dir>/.<name>.tmp`: hidden, and in the same directory so that the rename cannot cross filesystems.
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    path.with_file_name(format!(".{name}.tmp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary directory, removed when dropped.
    fn scratch(tag: &str) -> switchyard_test_support::scratch::TempDir {
        switchyard_test_support::scratch::dir(&format!("atomic-{tag}")).unwrap()
    }

    #[test]
    fn the_file_holds_what_was_written_and_no_temporary_is_left() {
        let dir = scratch("written");
        let path = dir.path().join("status.yaml");
        write_atomic_bytes(&path, b"old\n").unwrap();
        write_atomic(&path, |w| w.write_all(b"new\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["status.yaml"]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = scratch("failed");
        let path = dir.path().join("plan.yaml");
        write_atomic_bytes(&path, b"good\n").unwrap();
        let error = write_atomic(&path, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("serializer failed"))
        })
        .unwrap_err();
        assert_eq!(error.to_string(), "serializer failed");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "good\n");
        assert!(!dir.path().join(".plan.yaml.tmp").exists());
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_panic() {
        let dir = scratch("missing");
        let path = dir.path().join("absent").join("plan.yaml");
        assert_eq!(
            write_atomic_bytes(&path, b"x").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
