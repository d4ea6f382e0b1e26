//! One admission path, after TGI's `Validation`: every front end (the WS `generate` frame today,
//! the OpenAI HTTP API next, the token-level bench) hands a neutral [`GenerateRequest`] to
//! [`Validation::validate`], which returns a [`ValidRequest`] — token ids, checked sampling
//! params with the model's defaults applied, limits applied — or the [`EngineError`] for the
//! client. Nothing behind it checks a request again; the scheduler core only decides whether
//! there is room now (`overloaded`, dynamic admission control).
//!
//! Defaults, as in vLLM and TGI: a field the request sets wins; else the model's
//! generation_config.json ([`ModelDefaults`]); else brook's (`SamplingParams::default()`).

use std::sync::Arc;

use crate::chat::{render_chat, ChatMessage, ChatTemplate};
use crate::error::EngineError;
use crate::model::config::GenerationConfig;
use crate::sampling::params::{RawSamplingParams, SamplingParams};
use crate::tokenizer::Tokenizer;

/// The prompt, in one of the forms clients send.
#[derive(Debug, Clone)]
pub enum PromptInput {
    Text(String),
    /// Rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Token ids as they are (the token-level engine of `brook bench`, tests).
    Tokens(Vec<u32>),
}

/// A request as a front end hands it over, before any check.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub input: PromptInput,
    pub params: RawSamplingParams,
    /// Completions to generate from the prompt (parallel sampling; the OpenAI API's `n`):
    /// None = 1. Checked against `MAX_N` and the engine's sequence slots.
    pub n: Option<i64>,
}

/// Most completions one request may ask for.
pub const MAX_N: usize = 16;

/// A request that passed validation: the only thing the engine accepts (`EngineCore::submit`).
/// Built by [`Validation::validate`] alone, so holding one means every check passed.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    prompt_token_ids: Vec<u32>,
    params: SamplingParams,
    eos_token_ids: Arc<[u32]>,
    n: usize,
}

impl ValidRequest {
    pub fn prompt_token_ids(&self) -> &[u32] {
        &self.prompt_token_ids
    }

    /// Sampling params with the defaults applied and `max_tokens` cut to the context left.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The model's eos ids (ignored when `params.ignore_eos`).
    pub fn eos_token_ids(&self) -> &Arc<[u32]> {
        &self.eos_token_ids
    }

    /// Completions to generate (at least 1).
    pub fn n(&self) -> usize {
        self.n
    }

    pub fn into_parts(self) -> (Vec<u32>, SamplingParams, Arc<[u32]>) {
        (self.prompt_token_ids, self.params, self.eos_token_ids)
    }

    /// The same request on another sample stream (`seed`; None: one drawn at admission): one
    /// of a request's `n` choices. Every check still holds.
    pub fn with_seed(&self, seed: Option<u64>) -> ValidRequest {
        let mut r = self.clone();
        r.params.seed = seed;
        r
    }
}

/// The model's own defaults, from generation_config.json (parsed once, at start).
#[derive(Debug, Clone)]
pub struct ModelDefaults {
    /// brook's defaults overlaid with the model's temperature, top_p, top_k, min_p,
    /// repetition_penalty and max_new_tokens (as `max_tokens`).
    pub sampling: SamplingParams,
    /// Every id that ends generation: the tokenizer's eos, generation_config.json's and
    /// config.json's, without duplicates.
    pub eos_token_ids: Arc<[u32]>,
}

impl ModelDefaults {
    /// Checks the model's values as a request's would be checked; the error names the file.
    pub fn new(
        gen: Option<&GenerationConfig>,
        eos_token_ids: Vec<u32>,
        vocab_size: usize,
    ) -> anyhow::Result<Self> {
        let raw = match gen {
            None => RawSamplingParams::default(),
            Some(g) => RawSamplingParams {
                max_tokens: g
                    .max_new_tokens
                    .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
                temperature: g.temperature.map(f64::from),
                top_p: g.top_p.map(f64::from),
                top_k: g.top_k.map(|k| i64::try_from(k).unwrap_or(i64::MAX)),
                min_p: g.min_p.map(f64::from),
                repetition_penalty: g.repetition_penalty.map(f64::from),
                ..Default::default()
            },
        };
        let sampling = SamplingParams::from_raw(raw, &SamplingParams::default(), vocab_size)
            .map_err(|e| anyhow::anyhow!("generation_config.json has an unusable default: {e}"))?;
        Ok(ModelDefaults {
            sampling,
            eos_token_ids: eos_token_ids.into(),
        })
    }
}

/// Limits of the engine, fixed at start.
#[derive(Debug, Clone, Copy)]
pub struct ValidationLimits {
    /// Longest prompt admitted: one output token must still fit in the context window and in
    /// the KV pool.
    pub max_prompt_tokens: usize,
    /// Longest sequence, prompt and output; `max_tokens` is cut to what the prompt leaves.
    pub max_model_len: usize,
    /// The model's vocabulary: prompt and stop token ids must be below it.
    pub vocab_size: usize,
    /// Sequences the engine runs at once: a request's `n` choices must fit.
    pub max_num_seqs: usize,
}

/// Checks and tokenizes requests; runs on the caller's thread (a session, an HTTP handler).
pub struct Validation {
    /// `None`: a token-level engine (synthetic model), which takes token ids only.
    tokenizer: Option<Arc<Tokenizer>>,
    chat: Option<ChatTemplate>,
    defaults: ModelDefaults,
    limits: ValidationLimits,
}

impl Validation {
    pub fn new(
        tokenizer: Option<Arc<Tokenizer>>,
        chat: Option<ChatTemplate>,
        defaults: ModelDefaults,
        limits: ValidationLimits,
    ) -> Self {
        Validation {
            tokenizer,
            chat,
            defaults,
            limits,
        }
    }

    pub fn defaults(&self) -> &ModelDefaults {
        &self.defaults
    }

    pub fn limits(&self) -> &ValidationLimits {
        &self.limits
    }

    pub fn validate(&self, req: GenerateRequest) -> Result<ValidRequest, EngineError> {
        let vocab_size = self.limits.vocab_size;
        let choices = self.check_n(req.n)?;
        let mut params = SamplingParams::from_raw(req.params, &self.defaults.sampling, vocab_size)?;
        if !params.stop.is_empty() && self.tokenizer.is_none() {
            return Err(EngineError::invalid(
                "stop strings need a tokenizer; this engine (a synthetic model) has none",
            ));
        }
        let prompt_token_ids = self.tokenize(req.input)?;
        if prompt_token_ids.is_empty() {
            return Err(EngineError::invalid("the prompt encodes to no tokens"));
        }
        if let Some(bad) = prompt_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(EngineError::invalid(format!(
                "the prompt holds token id {bad}, outside the model's vocabulary of {vocab_size}"
            )));
        }
        let n = prompt_token_ids.len();
        if n > self.limits.max_prompt_tokens {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: n,
                limit: self.limits.max_prompt_tokens,
            });
        }
        // The context ends a request anyway (finish_reason `length`); saying so up front lets
        // the scheduler plan with the real bound.
        params.max_tokens = params
            .max_tokens
            .min(self.limits.max_model_len.saturating_sub(n).max(1));
        params.min_tokens = params.min_tokens.min(params.max_tokens);
        params.block_eos_before_min_tokens(&self.defaults.eos_token_ids);
        Ok(ValidRequest {
            prompt_token_ids,
            params,
            eos_token_ids: self.defaults.eos_token_ids.clone(),
            n: choices,
        })
    }

    /// `n` (None = 1) within 1..=MAX_N, and within the engine's sequence slots (its choices
    /// run at once).
    fn check_n(&self, n: Option<i64>) -> Result<usize, EngineError> {
        let limit = MAX_N.min(self.limits.max_num_seqs);
        match n {
            None => Ok(1),
            Some(n) if n >= 1 && n as u64 <= limit as u64 => Ok(n as usize),
            Some(n) => Err(EngineError::invalid(format!(
                "field `n` must be 1 to {limit}, got {n}"
            ))),
        }
    }

    fn tokenize(&self, input: PromptInput) -> Result<Vec<u32>, EngineError> {
        let tokenizer = || {
            self.tokenizer.as_deref().ok_or_else(|| {
                EngineError::invalid(
                    "this engine (a synthetic model) has no tokenizer; send token ids",
                )
            })
        };
        let encode = |tok: &Tokenizer, text: &str, add_special_tokens: bool| {
            tok.encode(text, add_special_tokens)
                .map_err(|e| EngineError::Internal(format!("tokenizer: {e}")))
        };
        match input {
            PromptInput::Tokens(ids) => Ok(ids),
            PromptInput::Text(text) if text.is_empty() => {
                Err(EngineError::invalid("field `prompt` is empty"))
            }
            PromptInput::Text(text) => encode(tokenizer()?, &text, true),
            PromptInput::Messages(messages) => {
                let tok = tokenizer()?;
                let text = render_chat(self.chat.as_ref(), &messages, true)?;
                // Templates usually write the bos token themselves; never add a second one.
                let has_bos = tok.bos_token().is_some_and(|b| text.starts_with(b));
                encode(tok, &text, !has_bos)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer_fixture::TokFixture;

    /// Defaults of every test: the fixture tokenizer, a role-token chat template, roomy limits.
    /// Each test changes one knob.
    struct Setup {
        tokenizer: bool,
        chat: bool,
        gen: Option<GenerationConfig>,
        limits: ValidationLimits,
    }

    impl Default for Setup {
        fn default() -> Self {
            Setup {
                tokenizer: true,
                chat: true,
                gen: None,
                limits: ValidationLimits {
                    max_prompt_tokens: 100,
                    max_model_len: 101,
                    vocab_size: 600,
                    max_num_seqs: 8,
                },
            }
        }
    }

    impl Setup {
        fn build(self) -> Validation {
            let tok = Arc::new(TokFixture::default().build());
            let chat = self.chat.then(|| {
                ChatTemplate::new(
                    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
                    tok.bos_token().map(str::to_owned),
                    tok.eos_token().map(str::to_owned),
                )
                .unwrap()
            });
            let defaults = ModelDefaults::new(
                self.gen.as_ref(),
                tok.eos_token_ids().to_vec(),
                self.limits.vocab_size,
            )
            .unwrap();
            Validation::new(self.tokenizer.then_some(tok), chat, defaults, self.limits)
        }
    }

    fn text(prompt: &str) -> GenerateRequest {
        GenerateRequest {
            input: PromptInput::Text(prompt.into()),
            params: RawSamplingParams::default(),
            n: None,
        }
    }

    fn tokens(ids: &[u32]) -> GenerateRequest {
        GenerateRequest {
            input: PromptInput::Tokens(ids.to_vec()),
            params: RawSamplingParams::default(),
            n: None,
        }
    }

    fn with(mut req: GenerateRequest, f: impl FnOnce(&mut RawSamplingParams)) -> GenerateRequest {
        f(&mut req.params);
        req
    }

    fn invalid(v: &Validation, req: GenerateRequest) -> String {
        match v.validate(req) {
            Err(EngineError::InvalidRequest(msg)) => msg,
            other => panic!("expected invalid_request, got {other:?}"),
        }
    }

    #[test]
    fn text_prompt_is_tokenized_with_brook_defaults() {
        let v = Setup::default().build();
        let r = v.validate(text("Hello world")).unwrap();
        let tok = TokFixture::default().build();
        assert_eq!(
            r.prompt_token_ids(),
            tok.encode("Hello world", true).unwrap()
        );
        assert_eq!(
            r.params(),
            &SamplingParams {
                // Cut to the context the prompt leaves.
                max_tokens: 101 - r.prompt_token_ids().len(),
                ..SamplingParams::default()
            }
        );
        assert_eq!(&r.eos_token_ids()[..], tok.eos_token_ids());
    }

    #[test]
    fn bad_params_name_the_field() {
        let v = Setup::default().build();
        let msg = invalid(&v, with(text("hi"), |p| p.top_p = Some(1.5)));
        assert!(msg.contains("params.top_p"), "{msg}");
        let msg = invalid(&v, with(text("hi"), |p| p.stop_token_ids = Some(vec![600])));
        assert!(
            msg.contains("stop_token_ids") && msg.contains("600"),
            "{msg}"
        );
    }

    #[test]
    fn empty_prompts_are_refused() {
        let v = Setup::default().build();
        assert!(invalid(&v, text("")).contains("`prompt` is empty"));
        assert!(invalid(&v, tokens(&[])).contains("no tokens"));
    }

    #[test]
    fn token_ids_outside_the_vocabulary_are_refused() {
        let v = Setup::default().build();
        assert!(v.validate(tokens(&[5, 599])).is_ok());
        let msg = invalid(&v, tokens(&[5, 600]));
        assert!(msg.contains("600") && msg.contains("vocabulary"), "{msg}");
    }

    #[test]
    fn prompt_longer_than_the_limit_is_prompt_too_long() {
        let v = Setup::default().build();
        let ok = v.validate(tokens(&[7; 100])).unwrap();
        // The longest prompt still gets its one output token.
        assert_eq!(ok.params().max_tokens, 1);
        assert_eq!(
            v.validate(tokens(&[7; 101])).unwrap_err(),
            EngineError::PromptTooLong {
                prompt_tokens: 101,
                limit: 100
            }
        );
        let long = "Hello world ".repeat(60);
        assert!(matches!(
            v.validate(text(&long)),
            Err(EngineError::PromptTooLong { limit: 100, .. })
        ));
    }

    #[test]
    fn n_is_checked_against_its_limit_and_the_sequence_slots() {
        let v = Setup::default().build();
        let with_n = |n| GenerateRequest {
            n: Some(n),
            ..tokens(&[5, 6])
        };
        assert_eq!(v.validate(tokens(&[5, 6])).unwrap().n(), 1);
        assert_eq!(v.validate(with_n(3)).unwrap().n(), 3);
        assert_eq!(v.validate(with_n(8)).unwrap().n(), 8);
        for bad in [0, -1, 9, 1000] {
            let e = invalid(&v, with_n(bad));
            assert!(e.contains("`n`") && e.contains("1 to 8"), "{e}");
        }
    }

    #[test]
    fn messages_render_with_the_template_and_one_bos() {
        let v = Setup::default().build();
        let tok = TokFixture::default().build();
        let msgs = vec![ChatMessage {
            role: "user".into(),
            content: "Hello".into(),
        }];
        let r = v
            .validate(GenerateRequest {
                input: PromptInput::Messages(msgs),
                params: RawSamplingParams::default(),
                n: None,
            })
            .unwrap();
        let bos = tok.bos_token_id().unwrap();
        assert_eq!(r.prompt_token_ids()[0], bos);
        assert_eq!(
            r.prompt_token_ids().iter().filter(|&&t| t == bos).count(),
            1
        );
        assert_eq!(tok.decode(r.prompt_token_ids(), true), "user: Hello\n");
    }

    #[test]
    fn chat_errors_are_invalid_requests() {
        let msgs = || {
            PromptInput::Messages(vec![ChatMessage {
                role: "wizard".into(),
                content: "x".into(),
            }])
        };
        let req = |input| GenerateRequest {
            input,
            params: RawSamplingParams::default(),
            n: None,
        };
        let v = Setup::default().build();
        assert!(invalid(&v, req(msgs())).contains("wizard"));
        let v = Setup {
            chat: false,
            ..Default::default()
        }
        .build();
        let msg = invalid(&v, req(PromptInput::Messages(vec![])));
        assert!(msg.contains("chat_template"), "{msg}");
    }

    #[test]
    fn without_a_tokenizer_only_token_ids_without_stop_strings_pass() {
        let v = Setup {
            tokenizer: false,
            ..Default::default()
        }
        .build();
        assert!(v.validate(tokens(&[1, 2, 3])).is_ok());
        assert!(invalid(&v, text("hi")).contains("send token ids"));
        let msg = invalid(&v, with(tokens(&[1]), |p| p.stop = Some(vec!["x".into()])));
        assert!(msg.contains("stop strings need a tokenizer"), "{msg}");
        // Stop token ids need no tokenizer.
        assert!(v
            .validate(with(tokens(&[1]), |p| p.stop_token_ids = Some(vec![3])))
            .is_ok());
    }

    #[test]
    fn request_overrides_model_default_overrides_brook_default() {
        let gen = GenerationConfig {
            temperature: Some(0.6),
            top_p: Some(0.9),
            top_k: Some(40),
            max_new_tokens: Some(20),
            repetition_penalty: Some(1.1),
            ..Default::default()
        };
        let v = Setup {
            gen: Some(gen),
            ..Default::default()
        }
        .build();
        assert_eq!(v.defaults().sampling.repetition_penalty, 1.1);
        // Unset: the model's defaults; min_p, which the model leaves out: brook's.
        let p = v.validate(tokens(&[5])).unwrap().params().clone();
        assert_eq!(
            (p.temperature, p.top_p, p.top_k, p.max_tokens, p.min_p),
            (0.6, 0.9, 40, 20, SamplingParams::default().min_p)
        );
        // Set: the request's.
        let p = v
            .validate(with(tokens(&[5]), |p| {
                p.temperature = Some(0.0);
                p.top_k = Some(0);
                p.max_tokens = Some(7);
            }))
            .unwrap()
            .params()
            .clone();
        assert_eq!(
            (p.temperature, p.top_p, p.top_k, p.max_tokens),
            (0.0, 0.9, 0, 7)
        );
    }

    #[test]
    fn unusable_model_defaults_fail_at_start_naming_the_file() {
        let gen = GenerationConfig {
            top_p: Some(0.0),
            ..Default::default()
        };
        let err = ModelDefaults::new(Some(&gen), vec![2], 600)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("generation_config.json") && err.contains("top_p"),
            "{err}"
        );
    }
}
