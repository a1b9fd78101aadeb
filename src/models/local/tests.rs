//! What a folder recall cannot load says: the file, and what is wrong with
//! it. (The model itself is checked against reference vectors in
//! tests/local_embedder.rs.)

use std::path::{Path, PathBuf};

use super::encoder::Encoder;
use super::folder::{Folder, Pooling};
use super::LocalEmbedding;

/// all-MiniLM-L6-v2's config.json.
const BERT: &str = r#"{"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1,
 "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 384,
 "initializer_range": 0.02, "intermediate_size": 1536, "layer_norm_eps": 1e-12,
 "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
 "num_hidden_layers": 6, "pad_token_id": 0, "position_embedding_type": "absolute",
 "type_vocab_size": 2, "vocab_size": 30522}"#;

/// A word-level tokenizer of three words.
const TOKENIZER: &str = r#"{"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
 "post_processor": null, "decoder": null,
 "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2},
           "unk_token": "[UNK]"}}"#;

/// A fresh directory holding `files` (path within it, text).
fn folder(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("recall-local-unit-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (path, text) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }
    dir
}

/// Loading fails, naming `file` of the folder, and `says`.
fn refused(dir: &Path, file: &str, says: &str) {
    let Err(e) = Encoder::load(dir) else {
        panic!("{} loaded", dir.display())
    };
    let e = e.to_string();
    let named = dir.join(file).display().to_string();
    assert!(e.contains(&named) && e.contains(says), "{e}");
}

#[test]
fn each_missing_or_broken_file_is_named() {
    let empty = folder("empty", &[]);
    refused(&empty, "config.json", "No such file");
    let broken = folder("broken", &[("config.json", "{")]);
    refused(&broken, "config.json", "EOF");
    let roberta = BERT.replace("\"bert\"", "\"xlm-roberta\"");
    let other = folder("other", &[("config.json", &roberta)]);
    refused(&other, "config.json", "not a BERT model");
    let swish = BERT.replace("\"gelu\"", "\"swish\"");
    let act = folder("act", &[("config.json", &swish)]);
    refused(&act, "config.json", "swish");

    let no_tokenizer = folder("no-tokenizer", &[("config.json", BERT)]);
    refused(&no_tokenizer, "tokenizer.json", "No such file");
    let bad_tokenizer = folder(
        "bad-tokenizer",
        &[("config.json", BERT), ("tokenizer.json", "[]")],
    );
    refused(&bad_tokenizer, "tokenizer.json", "");

    let both = [("config.json", BERT), ("tokenizer.json", TOKENIZER)];
    let no_weights = folder("no-weights", &both);
    refused(&no_weights, "model.safetensors", "No such file");
    let garbage = [&both[..], &[("model.safetensors", "not tensors")]].concat();
    let bad_weights = folder("bad-weights", &garbage);
    refused(&bad_weights, "model.safetensors", "");
}

#[test]
fn pooling_and_length_come_from_the_sentence_transformers_files() {
    let both = [("config.json", BERT), ("tokenizer.json", TOKENIZER)];
    // Without them: mean pooling, as long as the position embeddings.
    let plain = Folder::read(&folder("plain", &both)).unwrap();
    assert_eq!(plain.pooling, Pooling::Mean);
    let words = "hello world ".repeat(600);
    let cut = |f: &Folder| f.tokenizer.encode(words.as_str(), true).unwrap().len();
    assert_eq!(cut(&plain), 512);

    let cls = r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true,
        "pooling_mode_mean_tokens": false}"#;
    let files = [
        &both[..],
        &[
            ("1_Pooling/config.json", cls),
            ("sentence_bert_config.json", r#"{"max_seq_length": 256}"#),
        ],
    ]
    .concat();
    let st = Folder::read(&folder("cls", &files)).unwrap();
    assert_eq!(st.pooling, Pooling::Cls);
    assert_eq!(cut(&st), 256);

    let max = r#"{"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#;
    let files = [&both[..], &[("1_Pooling/config.json", max)]].concat();
    refused(
        &folder("max", &files),
        "1_Pooling/config.json",
        "mean of the tokens or by [CLS]",
    );
}

#[tokio::test]
async fn a_model_that_cannot_load_is_an_error_not_a_thread_that_waits() {
    let empty = folder("start-empty", &[]);
    let Err(e) = LocalEmbedding::start("local:x", &empty).await else {
        panic!("started")
    };
    assert!(e.to_string().contains("config.json"), "{e}");
}

/// A safetensors file of the named tensors (dtype, shape), zeros.
fn safetensors(tensors: &[(&str, &str, &[usize])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, dtype, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * if *dtype == "F16" { 2 } else { 4 };
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.resize(file.len() + at, 0);
    file
}

#[test]
fn weights_are_checked_by_name_type_and_shape() {
    use super::weights::{Weights, WeightsError};
    let file = safetensors(&[
        ("embeddings.word_embeddings.weight", "F32", &[3, 2]),
        ("bert.pooler.dense.bias", "F16", &[2]),
        ("scale", "F16", &[2]),
    ]);
    let w = Weights::read(&file).unwrap();
    assert_eq!(
        w.matrix("embeddings.word_embeddings.weight", 3, 2).unwrap(),
        vec![0.0; 6]
    );
    let why = |e: Result<Vec<f32>, WeightsError>| e.unwrap_err().to_string();
    let shape = why(w.matrix("embeddings.word_embeddings.weight", 2, 3));
    assert!(
        shape.contains("[3, 2]") && shape.contains("[2, 3]"),
        "{shape}"
    );
    assert!(why(w.vector("scale", 2)).contains("recall reads F32"));
    assert!(why(w.vector("missing", 1)).contains("no tensor \"missing\""));
    // A whole BertModel's checkpoint names its tensors under `bert.`.
    let prefixed = safetensors(&[("bert.embeddings.LayerNorm.weight", "F32", &[2])]);
    let w = Weights::read(&prefixed).unwrap();
    assert_eq!(w.vector("embeddings.LayerNorm.weight", 2).unwrap().len(), 2);
    assert!(Weights::read(b"nope").is_err());
}
