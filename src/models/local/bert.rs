//! BERT's encoder as Hugging Face's `BertModel` computes it, over f32
//! row-major matrices: embeddings, then self-attention and a feed-forward
//! block per layer, each followed by a residual sum and a layer norm.
//!
//! A pass holds several texts as consecutive rows, one per token, with no
//! padding: every step but attention works row by row, and attention runs
//! per text over its own rows, which is what a padded batch under an
//! attention mask computes for the real tokens. The products are
//! matrixmultiply's.

use serde::Deserialize;

use super::weights::{Weights, WeightsError};

/// config.json, the keys the encoder reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn absolute() -> String {
    "absolute".into()
}

/// `hidden_act`, in transformers' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Activation {
    /// The exact one, with erf.
    #[serde(rename = "gelu")]
    Gelu,
    /// The tanh approximation.
    #[serde(rename = "gelu_new", alias = "gelu_pytorch_tanh")]
    GeluTanh,
    #[serde(rename = "relu")]
    Relu,
}

impl Config {
    /// What the encoder cannot run, if anything.
    pub fn unsupported(&self) -> Option<String> {
        if self.position_embedding_type != "absolute" {
            return Some(format!(
                "position_embedding_type {:?} is not \"absolute\"",
                self.position_embedding_type
            ));
        }
        let heads = self.num_attention_heads;
        if heads == 0 || self.hidden_size % heads != 0 {
            return Some(format!(
                "hidden_size {} is not a multiple of num_attention_heads {heads}",
                self.hidden_size
            ));
        }
        None
    }
}

struct Linear {
    /// outputs × inputs, as PyTorch stores it.
    w: Vec<f32>,
    b: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl Linear {
    fn load(w: &Weights, name: &str, inputs: usize, outputs: usize) -> Result<Self, WeightsError> {
        Ok(Self {
            w: w.matrix(&format!("{name}.weight"), outputs, inputs)?,
            b: w.vector(&format!("{name}.bias"), outputs)?,
            inputs,
            outputs,
        })
    }

    /// `x W^T + b` for `rows` rows of `x`.
    fn apply(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y: Vec<f32> = self
            .b
            .iter()
            .copied()
            .cycle()
            .take(rows * self.outputs)
            .collect();
        let a = View::rows(x, rows, self.inputs);
        let wt = View {
            data: &self.w,
            rows: self.inputs,
            cols: self.outputs,
            row_stride: 1,
            col_stride: self.inputs,
        };
        let mut c = ViewMut::rows(&mut y, rows, self.outputs);
        product(1.0, a, wt, 1.0, &mut c);
        y
    }
}

struct LayerNorm {
    gain: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn load(w: &Weights, name: &str, size: usize, eps: f64) -> Result<Self, WeightsError> {
        // Checkpoints of the original BERT call them gamma and beta.
        let either = |a: &str, b: &str| {
            w.vector(&format!("{name}.{a}"), size)
                .or_else(|_| w.vector(&format!("{name}.{b}"), size))
        };
        Ok(Self {
            gain: either("weight", "gamma")?,
            bias: either("bias", "beta")?,
            eps: eps as f32,
        })
    }

    fn apply(&self, x: &mut [f32]) {
        let n = self.gain.len();
        for row in x.chunks_exact_mut(n) {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let scale = 1.0 / (var + self.eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(&self.gain).zip(&self.bias) {
                *v = (*v - mean) * scale * g + b;
            }
        }
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

pub struct Bert {
    word: Vec<f32>,
    position: Vec<f32>,
    kind: Vec<f32>,
    norm: LayerNorm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    activation: Activation,
    pub max_positions: usize,
    vocab: usize,
}

impl Bert {
    pub fn load(c: &Config, w: &Weights) -> Result<Self, WeightsError> {
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        let e = |n: &str| format!("embeddings.{n}");
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = |n: &str| format!("encoder.layer.{i}.{n}");
            layers.push(Layer {
                query: Linear::load(w, &l("attention.self.query"), h, h)?,
                key: Linear::load(w, &l("attention.self.key"), h, h)?,
                value: Linear::load(w, &l("attention.self.value"), h, h)?,
                attention_out: Linear::load(w, &l("attention.output.dense"), h, h)?,
                attention_norm: LayerNorm::load(w, &l("attention.output.LayerNorm"), h, eps)?,
                up: Linear::load(w, &l("intermediate.dense"), h, c.intermediate_size)?,
                down: Linear::load(w, &l("output.dense"), c.intermediate_size, h)?,
                out_norm: LayerNorm::load(w, &l("output.LayerNorm"), h, eps)?,
            });
        }
        Ok(Self {
            word: w.matrix(&e("word_embeddings.weight"), c.vocab_size, h)?,
            position: w.matrix(
                &e("position_embeddings.weight"),
                c.max_position_embeddings,
                h,
            )?,
            kind: w.matrix(&e("token_type_embeddings.weight"), c.type_vocab_size, h)?,
            norm: LayerNorm::load(w, &e("LayerNorm"), h, eps)?,
            layers,
            hidden: h,
            heads: c.num_attention_heads,
            activation: c.hidden_act,
            max_positions: c.max_position_embeddings,
            vocab: c.vocab_size,
        })
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The last layer's token vectors of `texts` (token ids, each at most
    /// `max_positions` long), one row per token, the texts one after the
    /// other.
    pub fn forward(&self, texts: &[&[u32]]) -> Vec<f32> {
        let h = self.hidden;
        let rows: usize = texts.iter().map(|t| t.len()).sum();
        let mut x = Vec::with_capacity(rows * h);
        for ids in texts {
            for (p, &id) in ids.iter().enumerate() {
                // The tokenizer's ids are within the vocabulary; one that is
                // not reads as the first (padding) token rather than panic.
                let id = if (id as usize) < self.vocab {
                    id as usize
                } else {
                    0
                };
                let word = &self.word[id * h..][..h];
                let pos = &self.position[p * h..][..h];
                x.extend(
                    word.iter()
                        .zip(pos)
                        .zip(&self.kind[..h])
                        .map(|((w, p), k)| w + p + k),
                );
            }
        }
        self.norm.apply(&mut x);
        let spans = spans(texts);
        for layer in &self.layers {
            x = self.layer(layer, x, rows, &spans);
        }
        x
    }

    fn layer(&self, l: &Layer, x: Vec<f32>, rows: usize, spans: &[(usize, usize)]) -> Vec<f32> {
        let (h, d) = (self.hidden, self.hidden / self.heads);
        let (q, k, v) = (
            l.query.apply(&x, rows),
            l.key.apply(&x, rows),
            l.value.apply(&x, rows),
        );
        let mut context = vec![0f32; rows * h];
        let scale = 1.0 / (d as f32).sqrt();
        let mut scores = Vec::new();
        for &(start, len) in spans {
            scores.resize(len * len, 0.0);
            for head in 0..self.heads {
                let at = start * h + head * d;
                let of = |m| head_of(m, at, len, d, h);
                let mut s = ViewMut::rows(&mut scores, len, len);
                product(scale, of(&q), of(&k).transposed(), 0.0, &mut s);
                softmax_rows(&mut scores, len);
                let mut out = ViewMut {
                    data: &mut context[at..],
                    rows: len,
                    cols: d,
                    row_stride: h,
                };
                product(1.0, View::rows(&scores, len, len), of(&v), 0.0, &mut out);
            }
        }
        let mut attended = l.attention_out.apply(&context, rows);
        attended.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
        l.attention_norm.apply(&mut attended);
        let mut inner = l.up.apply(&attended, rows);
        inner
            .iter_mut()
            .for_each(|v| *v = activate(self.activation, *v));
        let mut out = l.down.apply(&inner, rows);
        out.iter_mut().zip(&attended).for_each(|(o, a)| *o += a);
        l.out_norm.apply(&mut out);
        out
    }
}

/// One head's columns of a text's rows of `m` (queries, keys or values).
fn head_of(m: &[f32], at: usize, len: usize, d: usize, h: usize) -> View<'_> {
    View {
        data: &m[at..],
        rows: len,
        cols: d,
        row_stride: h,
        col_stride: 1,
    }
}

/// Where each text's rows start, and how many they are.
fn spans(texts: &[&[u32]]) -> Vec<(usize, usize)> {
    let mut start = 0;
    texts
        .iter()
        .map(|t| {
            let span = (start, t.len());
            start += t.len();
            span
        })
        .collect()
}

fn softmax_rows(m: &mut [f32], cols: usize) {
    for row in m.chunks_exact_mut(cols) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        row.iter_mut().for_each(|v| *v /= sum);
    }
}

fn activate(a: Activation, x: f32) -> f32 {
    match a {
        Activation::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        Activation::GeluTanh => {
            let inner = (2.0 / std::f32::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
            0.5 * x * (1.0 + inner.tanh())
        }
        Activation::Relu => x.max(0.0),
    }
}

/// A matrix within a slice: element (i, j) at `i * row_stride + j *
/// col_stride`.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    fn transposed(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    fn last(&self) -> usize {
        (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
    }
}

/// A matrix within a slice, by rows (elements of a row are adjacent).
struct ViewMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a> ViewMut<'a> {
    fn rows(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
        }
    }
}

/// `c ← alpha a b + beta c`.
fn product(alpha: f32, a: View, b: View, beta: f32, c: &mut ViewMut) {
    assert!(a.cols == b.rows && a.rows == c.rows && b.cols == c.cols);
    if c.rows == 0 || c.cols == 0 || a.cols == 0 {
        return;
    }
    assert!(a.last() < a.data.len() && b.last() < b.data.len());
    assert!(c.cols <= c.row_stride && (c.rows - 1) * c.row_stride + c.cols <= c.data.len());
    // SAFETY: every element sgemm reads of `a` and `b` and writes of `c` is
    // within its slice (the asserts above: the last element of each matrix
    // is), `c`'s rows do not overlap (its row stride is at least its width),
    // and `c` is borrowed mutably, so nothing else reads it meanwhile.
    unsafe {
        matrixmultiply::sgemm(
            a.rows,
            a.cols,
            b.cols,
            alpha,
            a.data.as_ptr(),
            a.row_stride as isize,
            a.col_stride as isize,
            b.data.as_ptr(),
            b.row_stride as isize,
            b.col_stride as isize,
            beta,
            c.data.as_mut_ptr(),
            c.row_stride as isize,
            1,
        );
    }
}
