//! Chat messages rendered with the model's Jinja chat_template (minijinja), in the environment
//! transformers' `apply_chat_template` provides: trim_blocks + lstrip_blocks, loop controls,
//! Python string methods (.strip(), .startswith(), ...), `raise_exception`, `strftime_now` and a
//! Python-compatible `tojson`.

use std::collections::BTreeMap;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::tokenizer::Tokenizer;

const TEMPLATE_NAME: &str = "chat";
pub const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    /// Bad `messages` from the client; the text names the index and field.
    #[error("{0}")]
    InvalidMessages(String),
    #[error("this model has no chat_template; send a \"prompt\" instead of \"messages\"")]
    NoTemplate,
    /// The model's template does not compile (a model-loading problem, not the client's).
    #[error("the model's chat_template does not compile: {0}")]
    Compile(String),
    /// The template called `raise_exception`, e.g. for roles that do not alternate.
    #[error("chat template rejected the messages: {0}")]
    Raised(String),
    #[error("chat template failed to render the messages: {0}")]
    Render(String),
}

impl From<ChatError> for EngineError {
    fn from(e: ChatError) -> Self {
        match e {
            ChatError::Compile(_) => EngineError::Internal(e.to_string()),
            _ => EngineError::InvalidRequest(e.to_string()),
        }
    }
}

/// Marks errors raised by the template itself so they reach the client as the template's message.
#[derive(Debug)]
struct TemplateRaised(String);

impl std::fmt::Display for TemplateRaised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateRaised {}

/// Checks messages that are already typed: a non-empty list with known roles.
pub fn validate_messages(messages: &[ChatMessage]) -> Result<(), ChatError> {
    if messages.is_empty() {
        return Err(ChatError::InvalidMessages(
            "messages must be a non-empty list".into(),
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ChatError::InvalidMessages(format!(
                "messages[{i}].role must be one of {}, got {:?}",
                ROLES.join(", "),
                m.role
            )));
        }
    }
    Ok(())
}

/// Parses a request's `messages` JSON value with errors that name the offending index and field
/// (serde's own errors for a `Vec<ChatMessage>` do not say which element failed).
pub fn parse_messages(value: &serde_json::Value) -> Result<Vec<ChatMessage>, ChatError> {
    let bad = |msg: String| ChatError::InvalidMessages(msg);
    let list = value
        .as_array()
        .ok_or_else(|| bad("messages must be a list of {\"role\", \"content\"} objects".into()))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let obj = item.as_object().ok_or_else(|| {
            bad(format!(
                "messages[{i}] must be an object with role and content"
            ))
        })?;
        if let Some(key) = obj.keys().find(|k| *k != "role" && *k != "content") {
            return Err(bad(format!(
                "messages[{i}] has unknown field {key:?}; expected role and content"
            )));
        }
        let field = |name: &str| match obj.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(bad(format!("messages[{i}].{name} must be a string"))),
            None => Err(bad(format!("messages[{i}].{name} is missing"))),
        };
        out.push(ChatMessage {
            role: field("role")?,
            content: field("content")?,
        });
    }
    validate_messages(&out)?;
    Ok(out)
}

/// A compiled chat template; compile once per model and share it (it is `Send + Sync`).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Option<String>,
    eos: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    pub fn new(
        template_src: &str,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        // transformers renders with jinja2.Environment(trim_blocks=True, lstrip_blocks=True).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, template_src.to_owned())
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The tokenizer's template, or `None` when the model has none (prompts still work).
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Option<Self>, ChatError> {
        tok.chat_template()
            .map(|src| {
                ChatTemplate::new(
                    src,
                    tok.bos_token().map(str::to_owned),
                    tok.eos_token().map(str::to_owned),
                )
            })
            .transpose()
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        validate_messages(messages)?;
        // bos/eos are left undefined (rendering as "") when the model has none, as in
        // transformers; a `none` value would render as the text "none".
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        if let Some(bos) = &self.bos {
            ctx.insert("bos_token", Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos {
            ctx.insert("eos_token", Value::from(eos.as_str()));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        template.render(ctx).map_err(|e| {
            let raised = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<TemplateRaised>())
                .map(|r| r.0.clone());
            match raised {
                Some(msg) => ChatError::Raised(msg),
                None => ChatError::Render(e.to_string()),
            }
        })
    }
}

/// Renders `messages` with the model's template; a model without one is a client error.
pub fn render_chat(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, ChatError> {
    template
        .ok_or(ChatError::NoTemplate)?
        .render(messages, add_generation_prompt)
}

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, msg.clone())
            .with_source(TemplateRaised(msg)),
    )
}

/// Current UTC time (transformers uses the server's local time; brook servers run in UTC).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime::format(&fmt, secs)
}

/// `json.dumps(x, ensure_ascii=False, indent=indent)` as transformers' tojson does: ", " and ": "
/// separators when compact, no HTML escaping (minijinja's built-in escapes `<`, `>`, `&`, `'`).
/// Other Python keyword arguments are accepted and ignored; map keys come out sorted.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    for ignored in ["ensure_ascii", "sort_keys", "separators"] {
        let _: Option<Value> = kwargs.get(ignored)?;
    }
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonCompact,
        )),
    };
    result.map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON")
            .with_source(e)
    })?;
    let s = String::from_utf8(out).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "JSON is not UTF-8").with_source(e)
    })?;
    Ok(Value::from_safe_string(s))
}

/// Python's default `json.dumps` separators: `", "` between items, `": "` after keys.
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        comma_unless_first(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        comma_unless_first(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

fn comma_unless_first<W: ?Sized + std::io::Write>(
    writer: &mut W,
    first: bool,
) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

/// The strftime directives chat templates use (Llama 3.x: `"%d %b %Y"`), over UTC.
mod strftime {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const WEEKDAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];

    /// Proleptic Gregorian (year, month 1-12, day 1-31) of a day count since 1970-01-01
    /// (H. Hinnant's civil_from_days).
    fn civil_from_days(days: i64) -> (i64, u32, u32) {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        (year, month, day)
    }

    fn is_leap(y: i64) -> bool {
        (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
    }

    /// Formats `unix_secs` (UTC); unknown directives are copied through as written.
    pub fn format(fmt: &str, unix_secs: i64) -> String {
        let days = unix_secs.div_euclid(86_400);
        let secs = unix_secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
        let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
        const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUMULATIVE[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
        let month_name = MONTHS[month as usize - 1];
        let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('Y') => out.push_str(&year.to_string()),
                Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
                Some('m') => out.push_str(&format!("{month:02}")),
                Some('d') => out.push_str(&format!("{day:02}")),
                Some('e') => out.push_str(&format!("{day:>2}")),
                Some('j') => out.push_str(&format!("{yday:03}")),
                Some('H') => out.push_str(&format!("{hour:02}")),
                Some('I') => out.push_str(&format!("{hour12:02}")),
                Some('M') => out.push_str(&format!("{minute:02}")),
                Some('S') => out.push_str(&format!("{second:02}")),
                Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
                Some('B') => out.push_str(month_name),
                Some('b') | Some('h') => out.push_str(&month_name[..3]),
                Some('A') => out.push_str(WEEKDAYS[weekday]),
                Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
                Some('Z') => out.push_str("UTC"),
                Some('z') => out.push_str("+0000"),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::format;

        #[test]
        fn formats_known_instants() {
            assert_eq!(format("%d %b %Y", 0), "01 Jan 1970");
            // 2024-03-01 00:00:00 UTC: the day after a leap day, a Friday.
            assert_eq!(
                format("%Y-%m-%d %A %j", 1_709_251_200),
                "2024-03-01 Friday 061"
            );
            // 2000-02-29 13:05:09 UTC (a Tuesday): leap day of a year divisible by 400.
            let t = 951_782_400 + 13 * 3600 + 5 * 60 + 9;
            assert_eq!(
                format("%e %B %y %I:%M:%S %p %a %%", t),
                "29 February 00 01:05:09 PM Tue %"
            );
        }
    }
}

#[cfg(test)]
mod tests;
