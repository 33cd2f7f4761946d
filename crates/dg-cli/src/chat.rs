//! Chat prompts: the model's chat template (`chat_template.jinja`, or `chat_template` in
//! `tokenizer_config.json`, or a GGUF file's `tokenizer.chat_template`) rendered with minijinja the way transformers renders it (`trim_blocks`,
//! `lstrip_blocks`, Python string methods, `raise_exception`, floats printed as Python prints
//! them) for a list of messages (one user message for `dg generate --chat`, whole conversations
//! with tools, tool calls and template variables such as `enable_thinking` for `dg serve`) followed
//! by the generation prompt. [`reply`] reads the model's reply back (reasoning, tool calls).

mod py_values;
pub mod reply;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use dg_model::ModelDir;
use minijinja::{Environment, ErrorKind, Value};
use serde_json::{Map, Value as Json};

use crate::error::{Input, input};

/// A chat template and the special tokens it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    origin: PathBuf,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The model's template: its directory's, else (a GGUF model) the one the file carries, with
    /// the `<bos>` and `<eos>` of the file's vocabulary; `None` when there is neither.
    pub fn load(model: &ModelDir) -> Result<Option<Self>> {
        if let Some(t) = Self::from_dir(&model.dir)? {
            return Ok(Some(t));
        }
        let Some(file) = model.checkpoint.gguf() else { return Ok(None) };
        let Some(vocab) = file.vocab().context(Input(format!("cannot read the tokenizer of {}", file.path().display())))? else {
            return Ok(None);
        };
        let Some(source) = vocab.chat_template else { return Ok(None) };
        let token = |id: Option<u32>| id.map_or_else(String::new, |id| vocab.tokens[id as usize].clone());
        Ok(Some(ChatTemplate {
            source,
            origin: PathBuf::from(format!("{} (tokenizer.chat_template)", file.path().display())),
            bos_token: token(vocab.special.bos),
            eos_token: token(vocab.special.eos),
        }))
    }

    /// The template of `dir`, or `None` when the directory has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = if config_path.is_file() {
            let text = std::fs::read_to_string(&config_path).context(Input(format!("cannot read {}", config_path.display())))?;
            serde_json::from_str(&text).context(Input(format!("{}: malformed JSON", config_path.display())))?
        } else {
            Json::Null
        };
        let token = |key: &str| match &config[key] {
            Json::String(s) => s.clone(),
            Json::Object(o) => o.get("content").and_then(Json::as_str).unwrap_or_default().to_string(),
            _ => String::new(),
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = if jinja.is_file() {
            let text = std::fs::read_to_string(&jinja).context(Input(format!("cannot read {}", jinja.display())))?;
            (text, jinja)
        } else {
            match template_in_config(&config["chat_template"]) {
                Some(t) => (t, config_path),
                None => return Ok(None),
            }
        };
        Ok(Some(ChatTemplate { source, origin, bos_token: token("bos_token"), eos_token: token("eos_token") }))
    }

    /// Whether the template renders a request's `tools` (it refers to them).
    pub fn renders_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// The prompt text for one user message, ending with the generation prompt.
    pub fn render_user(&self, content: &str) -> Result<String> {
        self.render(&[("user", content)])
    }

    /// [`Self::render_user`] with `images` image parts before the text (the content a list of
    /// parts, as transformers' `apply_chat_template` gets it; none: the content a string).
    pub fn render_user_with_images(&self, content: &str, images: usize) -> Result<String> {
        if images == 0 {
            return self.render_user(content);
        }
        let mut parts = vec![serde_json::json!({"type": "image"}); images];
        parts.push(serde_json::json!({"type": "text", "text": content}));
        let messages = [serde_json::json!({"role": "user", "content": parts})];
        self.render_conversation(&Conversation { messages: &messages, tools: None, kwargs: &Map::new(), add_generation_prompt: true })
    }

    /// The prompt text for `(role, content)` messages in order (system, user and assistant turns),
    /// ending with the generation prompt.
    pub fn render(&self, turns: &[(&str, &str)]) -> Result<String> {
        let messages: Vec<Json> = turns.iter().map(|&(role, content)| serde_json::json!({"role": role, "content": content})).collect();
        self.render_conversation(&Conversation { messages: &messages, tools: None, kwargs: &Map::new(), add_generation_prompt: true })
    }

    /// The prompt text of a whole conversation, as transformers' `apply_chat_template(messages,
    /// tools=tools, add_generation_prompt=..., **kwargs)` renders it: messages and tools are passed
    /// to the template as given (OpenAI's shapes, tool-call arguments as objects), `kwargs` (e.g.
    /// `enable_thinking`) as template variables.
    pub fn render_conversation(&self, conversation: &Conversation<'_>) -> Result<String> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().expect("default delimiters are valid"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        let bad = || Input(format!("chat template {}", self.origin.display()));
        let template = env.template_from_str(&self.source).map_err(anyhow::Error::new).context(bad())?;
        let mut vars: Map<String, Json> = conversation.kwargs.clone();
        vars.insert("messages".into(), Json::Array(conversation.messages.to_vec()));
        vars.insert("tools".into(), conversation.tools.map_or(Json::Null, |t| Json::Array(t.to_vec())));
        vars.insert("add_generation_prompt".into(), Json::Bool(conversation.add_generation_prompt));
        vars.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        vars.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        template.render(py_values::to_value(&Json::Object(vars))).map_err(anyhow::Error::new).context(bad())
    }
}

/// What a chat template renders: `messages` and `tools` in OpenAI's shapes, the template variables
/// of `chat_template_kwargs`, and whether to end with the generation prompt.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a [Json]>,
    pub kwargs: &'a Map<String, Json>,
    pub add_generation_prompt: bool,
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of `{name, template}` (the one
/// named "default", else the first).
fn template_in_config(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => {
            let named = |name: &str| list.iter().find(|t| t["name"] == name);
            named("default").or(list.first())?["template"].as_str().map(str::to_string)
        }
        _ => None,
    }
}

/// The model's template, or an input error saying that `--chat` needs one.
pub fn require(model: &ModelDir) -> Result<ChatTemplate> {
    ChatTemplate::load(model)?.ok_or_else(|| {
        let gguf = if model.checkpoint.gguf().is_some() { " (nor does the GGUF file carry a tokenizer.chat_template)" } else { "" };
        input(format!(
            "--chat needs a chat template, but {} has neither chat_template.jinja nor a chat_template \
             in tokenizer_config.json{gguf}",
            model.dir.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate { source: source.into(), origin: "t.jinja".into(), bos_token: "<bos>".into(), eos_token: "<eos>".into() }
    }

    #[test]
    fn renders_like_transformers() {
        let t = template(
            "{{ bos_token }}{% for message in messages %}\n<|turn>{{ message['role'] }}\n\
             {{ message['content'] | trim }}<turn|>\n{% endfor %}\n{% if add_generation_prompt %}\n\
             <|turn>model\n{% endif %}\n",
        );
        assert_eq!(t.render_user(" hi ").unwrap(), "<bos><|turn>user\nhi<turn|>\n<|turn>model\n");
        let turns = [("system", "be brief"), ("user", "hi"), ("model", "hello")];
        assert_eq!(
            t.render(&turns).unwrap(),
            "<bos><|turn>system\nbe brief<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\nhello<turn|>\n<|turn>model\n"
        );
    }

    #[test]
    fn python_methods_and_exceptions() {
        let t = template("{{ messages[0]['content'].strip().upper() }}");
        assert_eq!(t.render_user(" a ").unwrap(), "A");
        let t = template("{{ raise_exception('only user turns') }}");
        assert!(format!("{:#}", t.render_user("x").unwrap_err()).contains("only user turns"));
    }

    /// The converter fixture's template (DiffusionGemma's, in the GGUF file) renders every
    /// conversation of `chat.jsonl` as transformers did, and as the HF directory's copy does.
    #[test]
    fn a_gguf_template_renders_as_transformers() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converter-gemma4-vocab");
        let model = ModelDir::open(&fixture.join("model.gguf")).unwrap();
        let from_gguf = ChatTemplate::load(&model).unwrap().expect("the file carries a template");
        assert!(from_gguf.origin.to_string_lossy().contains("tokenizer.chat_template"));
        let from_hf = ChatTemplate::from_dir(&fixture.join("hf")).unwrap().unwrap();
        let text = std::fs::read_to_string(fixture.join("chat.jsonl")).unwrap();
        for (i, line) in text.lines().enumerate() {
            let case: Json = serde_json::from_str(line).unwrap();
            let turns: Vec<(&str, &str)> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect();
            let ours = from_gguf.render(&turns).unwrap();
            assert_eq!(ours, case["text"].as_str().unwrap(), "conversation {i}");
            assert_eq!(ours, from_hf.render(&turns).unwrap(), "conversation {i}");
        }
    }

    /// DiffusionGemma's template renders every conversation of `fixtures/chat-tools` (tools, tool
    /// calls, tool responses, multi-turn, `enable_thinking` on and off) byte for byte as
    /// transformers' `apply_chat_template` did.
    #[test]
    fn tool_conversations_render_as_transformers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let template = ChatTemplate::from_dir(&root.join("converter-gemma4-vocab/hf")).unwrap().unwrap();
        let text = std::fs::read_to_string(root.join("chat-tools/conversations.jsonl")).unwrap();
        let mut cases = 0;
        for line in text.lines() {
            let case: Json = serde_json::from_str(line).unwrap();
            let name = case["name"].as_str().unwrap();
            let conversation = Conversation {
                messages: case["messages"].as_array().unwrap(),
                tools: case["tools"].as_array().map(Vec::as_slice),
                kwargs: case["kwargs"].as_object().unwrap(),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            };
            let ours = template.render_conversation(&conversation).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(ours, case["text"].as_str().unwrap(), "{name}");
            cases += 1;
        }
        assert!(cases >= 20, "{cases} cases");
    }

    #[test]
    fn config_template_forms() {
        assert_eq!(template_in_config(&serde_json::json!("x")).as_deref(), Some("x"));
        let list = serde_json::json!([{"name": "tool_use", "template": "a"}, {"name": "default", "template": "b"}]);
        assert_eq!(template_in_config(&list).as_deref(), Some("b"));
        assert_eq!(template_in_config(&Json::Null), None);
    }
}
