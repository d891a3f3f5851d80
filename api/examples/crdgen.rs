//! Writes the generated CRD into every directory given on the command line (`make generate`).

use std::{path::Path, process::ExitCode};

fn main() -> ExitCode {
    let yaml = match switchyard_api::crd::crd_yaml() {
        Ok(yaml) => yaml,
        Err(error) => {
            eprintln!("crdgen: {error}");
            return ExitCode::FAILURE;
        }
    };
    for dir in std::env::args().skip(1) {
        let path = Path::new(&dir).join(switchyard_api::crd::CRD_FILE);
        if let Err(error) = std::fs::write(&path, &yaml) {
            eprintln!("crdgen: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
