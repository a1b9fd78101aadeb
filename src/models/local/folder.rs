//! A sentence-transformers model folder as recall reads it: the BERT
//! config, the tokenizer, the weights, and the two sentence-transformers
//! files that say how long an input may be and how its tokens are pooled.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams};

use super::bert::Config as BertConfig;

/// Why a folder cannot be loaded: always the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", file.display())]
    Invalid { file: PathBuf, message: String },
}

impl LoadError {
    pub fn invalid(file: &Path, message: impl std::fmt::Display) -> Self {
        Self::Invalid {
            file: file.to_owned(),
            message: message.to_string(),
        }
    }
}

/// How a text's token vectors become one vector (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the tokens the attention mask keeps.
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
}

pub const CONFIG: &str = "config.json";
pub const TOKENIZER: &str = "tokenizer.json";
pub const WEIGHTS: &str = "model.safetensors";
const SENTENCE_CONFIG: &str = "sentence_bert_config.json";
const POOLING: &str = "1_Pooling/config.json";

/// Everything read from the folder but the weights, which the encoder
/// loads itself (`weights` names their file).
pub struct Folder {
    pub config: BertConfig,
    /// Truncates at the model's longest input (sentence_bert_config.json's
    /// max_seq_length), pads nothing (the encoder pads a batch).
    pub tokenizer: Tokenizer,
    pub pooling: Pooling,
    pub weights: PathBuf,
}

#[derive(Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

/// `1_Pooling/config.json`'s modes; the ones recall does not compute are
/// read to be refused.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PoolingConfig {
    pooling_mode_cls_token: bool,
    pooling_mode_mean_tokens: bool,
    pooling_mode_max_tokens: bool,
    pooling_mode_mean_sqrt_len_tokens: bool,
    pooling_mode_weightedmean_tokens: bool,
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize)]
struct ModelType {
    model_type: Option<String>,
}

impl Folder {
    pub fn read(dir: &Path) -> Result<Self, LoadError> {
        let config_file = dir.join(CONFIG);
        let text = read(&config_file)?;
        let kind: ModelType = parse(&config_file, &text)?;
        if let Some(t) = kind.model_type.filter(|t| t != "bert") {
            return Err(LoadError::invalid(
                &config_file,
                format!("model_type {t:?} is not a BERT model (\"bert\")"),
            ));
        }
        let config: BertConfig = parse(&config_file, &text)?;
        if let Some(why) = config.unsupported() {
            return Err(LoadError::invalid(&config_file, why));
        }
        // sentence-transformers truncates at max_seq_length; a model that
        // does not say is bounded by its position embeddings.
        let sentence = dir.join(SENTENCE_CONFIG);
        let said = match optional(&sentence)? {
            Some(text) => parse::<SentenceConfig>(&sentence, &text)?.max_seq_length,
            None => None,
        };
        let max_tokens = said
            .unwrap_or(config.max_position_embeddings)
            .min(config.max_position_embeddings);
        if max_tokens < 2 {
            return Err(LoadError::invalid(
                &sentence,
                "max_seq_length leaves no room for a token",
            ));
        }
        let pooling_file = dir.join(POOLING);
        let pooling = match optional(&pooling_file)? {
            Some(text) => pooling(&pooling_file, parse(&pooling_file, &text)?)?,
            None => Pooling::Mean,
        };
        let tokenizer_file = dir.join(TOKENIZER);
        let tokenizer = tokenizer(&tokenizer_file, max_tokens)?;
        Ok(Self {
            config,
            tokenizer,
            pooling,
            weights: dir.join(WEIGHTS),
        })
    }
}

fn pooling(file: &Path, c: PoolingConfig) -> Result<Pooling, LoadError> {
    let others = c.pooling_mode_max_tokens
        || c.pooling_mode_mean_sqrt_len_tokens
        || c.pooling_mode_weightedmean_tokens
        || c.pooling_mode_lasttoken;
    match (c.pooling_mode_mean_tokens, c.pooling_mode_cls_token, others) {
        (true, false, false) => Ok(Pooling::Mean),
        (false, true, false) => Ok(Pooling::Cls),
        _ => Err(LoadError::invalid(
            file,
            "recall pools by the mean of the tokens or by [CLS], one of them alone",
        )),
    }
}

/// The folder's tokenizer, truncating at `max_tokens` (special tokens
/// included) instead of what tokenizer.json says, as sentence-transformers
/// does, and padding nothing.
fn tokenizer(file: &Path, max_tokens: usize) -> Result<Tokenizer, LoadError> {
    // Parsed through FromStr, whose serde code is compiled with tokenizers
    // itself rather than instantiated (and optimised) in recall.
    let mut t: Tokenizer = read(file)?
        .parse()
        .map_err(|e| LoadError::invalid(file, e))?;
    t.with_padding(None);
    t.with_truncation(Some(TruncationParams {
        max_length: max_tokens,
        ..TruncationParams::default()
    }))
    .map_err(|e| LoadError::invalid(file, e))?;
    Ok(t)
}

fn read(file: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(file).map_err(|source| LoadError::Read {
        file: file.to_owned(),
        source,
    })
}

/// A file the folder may leave out.
fn optional(file: &Path) -> Result<Option<String>, LoadError> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LoadError::Read {
            file: file.to_owned(),
            source,
        }),
    }
}

fn parse<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, LoadError> {
    serde_json::from_str(text).map_err(|e| LoadError::invalid(file, e))
}
