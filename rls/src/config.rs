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

/// How a directory is read: the service's settings that change a load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`: files naming one
    /// domain add their top-level descriptors to it (a key and value
    /// repeated across them is still a duplicate), rather than being an error.
    pub merge_domains: bool,
    /// The algorithm of limits whose file names none.
    pub default_algorithm: Algorithm,
}

/// Every domain of a configuration directory, checked, in file-name order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigSet {
    /// One entry per file: the file and its domain.
    pub domains: Vec<(PathBuf, DomainConfig)>,
}

impl ConfigSet {
    /// Loads `path`: a directory (every `*.yaml` and `*.yml` file in it,
    /// not recursing, dot files skipped) or a single file.
    pub fn load(path: &Path, options: LoadOptions) -> Result<ConfigSet, ConfigError> {
        let files = config_files(path)?;
        let mut set = ConfigSet::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
                path: file.clone(),
                source,
            })?;
            let mut domain = DomainConfig::parse(&file, &text)?;
            default_algorithm(&mut domain.descriptors, options.default_algorithm);
            let Some((first, earlier)) = set
                .domains
                .iter_mut()
                .find(|(_, d)| d.domain == domain.domain)
            else {
                set.domains.push((file, domain));
                continue;
            };
            if !options.merge_domains {
                return Err(ConfigError::DuplicateDomain {
                    path: file,
                    domain: domain.domain,
                    first: first.clone(),
                });
            }
            for descriptor in domain.descriptors {
                let key = descriptor.composite_key();
                if earlier.descriptors.iter().any(|d| d.composite_key() == key) {
                    return Err(ConfigError::Unservable {
                        path: file,
                        domain: domain.domain,
                        descriptor: key,
                        message: format!(
                            "duplicate descriptor: {} configures it in this domain already (MERGE_DOMAIN_CONFIG merges domains, not descriptors)",
                            first.display()
                        ),
                    });
                }
                earlier.descriptors.push(descriptor);
            }
        }
        Ok(set)
    }
}

/// Gives every limit that names no algorithm `algorithm`.
fn default_algorithm(descriptors: &mut [DescriptorConfig], algorithm: Algorithm) {
    for descriptor in descriptors {
        if let Some(rate_limit) = descriptor.rate_limit.as_mut() {
            if let (Some(limit), None) = (rate_limit.limit.as_mut(), rate_limit.algorithm) {
                limit.algorithm = algorithm;
            }
        }
        default_algorithm(&mut descriptor.descriptors, algorithm);
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
