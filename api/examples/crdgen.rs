//! Writes the generated CRDs into every directory given on the command line (`make generate`).

use std::{path::Path, process::ExitCode};

fn main() -> ExitCode {
    let files = match switchyard_api::crd::crd_files() {
        Ok(files) => files,
        Err(error) => {
            eprintln!("crdgen: {error}");
            return ExitCode::FAILURE;
        }
    };
    for dir in std::env::args().skip(1) {
        for (file, yaml) in &files {
            let path = Path::new(&dir).join(file);
            if let Err(error) = std::fs::write(&path, yaml) {
                eprintln!("crdgen: writing {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {}", path.display());
        }
    }
    ExitCode::SUCCESS
}
