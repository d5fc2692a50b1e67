//! envoyproxy/ratelimit's YAML configuration: the file model, and loading
//! a directory of files (one domain each) into a checked [`ConfigSet`].
//!
//! The model follows envoyproxy/ratelimit's loader (`config_impl.go`):
//! unknown keys are errors, a descriptor needs a key, a limit needs a unit
//! unless it is `unlimited` (and must not have one if it is), `replaces`
//! entries need a name other than their own, and two siblings with the
//! same `key` and `value` are a duplicate. Every error names the file, the
//! line and the field ([`ConfigError`]).

mod error;
mod model;

use std::path::{Path, PathBuf};

pub use error::ConfigError;
pub use model::{
    Algorithm, DescriptorConfig, DomainConfig, Limit, RateLimitConfig, Replaces, Unit,
};

/// Every domain of a configuration directory, checked, in file-name order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigSet {
    /// One entry per file: the file and its domain.
    pub domains: Vec<(PathBuf, DomainConfig)>,
}

impl ConfigSet {
    /// Loads `path`: a directory (every `*.yaml` and `*.yml` file in it,
    /// not recursing, dot files skipped) or a single file.
    pub fn load(path: &Path) -> Result<ConfigSet, ConfigError> {
        let files = config_files(path)?;
        let mut set = ConfigSet::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
                path: file.clone(),
                source,
            })?;
            let domain = DomainConfig::parse(&file, &text)?;
            if let Some((first, _)) = set.domains.iter().find(|(_, d)| d.domain == domain.domain) {
                return Err(ConfigError::DuplicateDomain {
                    path: file,
                    domain: domain.domain,
                    first: first.clone(),
                });
            }
            set.domains.push((file, domain));
        }
        Ok(set)
    }
}

/// The YAML files `path` names, sorted so loads are reproducible.
fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read)? {
        let file = entry.map_err(read)?.path();
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let yaml = matches!(
            file.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if yaml && !name.starts_with('.') && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}
