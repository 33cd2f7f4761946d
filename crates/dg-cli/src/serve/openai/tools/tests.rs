//! The tools module's tests: tool calls' arguments decoded, bad fields named, a reply as OpenAI deltas
//! and a message, OpenAI-shaped conversations rendered as transformers rendered them.

use super::*;

fn body(extra: Value) -> Map<String, Value> {
    let mut m = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    m.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    m.as_object().unwrap().clone()
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}})
}

#[test]
fn calls_arguments_are_decoded_for_the_template() {
    let messages = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]);
    let chat = chat(&body(json!({"messages": messages, "tools": [weather()], "chat_template_kwargs": {"enable_thinking": true}}))).unwrap();
    assert_eq!(chat.messages[1]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}));
    assert_eq!(chat.messages[1]["tool_calls"][1]["function"]["arguments"], json!({}));
    assert_eq!((chat.tool_choice, chat.parallel_tool_calls), (ToolChoice::Auto, true));
    assert_eq!(chat.kwargs["enable_thinking"], true);
}

#[test]
fn bad_tool_fields_are_named() {
    let call = |arguments: Value| {
        json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": arguments}}]}]})
    };
    for (extra, param) in [
        (json!({"tools": {}}), "tools"),
        (json!({"tools": [{"type": "function", "function": {"parameters": {}}}]}), "tools[0]"),
        (json!({"tools": [weather()], "tool_choice": "any"}), "tool_choice"),
        (json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        (json!({"chat_template_kwargs": {"tools": []}}), "chat_template_kwargs"),
        (call(json!("[1]")), "messages[1].tool_calls[0].function.arguments"),
        (call(json!("{bad")), "messages[1].tool_calls[0].function.arguments"),
        (json!({"messages": [{"role": "tool", "content": "x"}]}), "messages[0]"),
        (json!({"messages": [{"role": "assistant"}]}), "messages[0]"),
        (json!({"messages": [{"role": "critic", "content": "x"}]}), "messages[0]"),
    ] {
        let e = chat(&body(extra.clone())).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
    }
}

/// The deltas of `pieces` pushed in turn, and the finish.
fn reply(setup: ReplySetup, pieces: &[&str]) -> (Vec<Value>, bool, Vec<String>) {
    let (mut r, mut deltas) = ChatReply::new(setup, 7);
    for p in pieces {
        deltas.extend(r.push(p));
    }
    let (rest, called, warnings) = r.finish();
    deltas.extend(rest);
    (deltas, called, warnings)
}

fn setup(choice: ToolChoice, prompt: &str) -> ReplySetup {
    let chat = Chat { messages: vec![], tools: vec![weather()], tool_choice: choice, parallel_tool_calls: false, kwargs: Map::new() };
    ReplySetup::new(&chat, prompt)
}

#[test]
fn a_reply_becomes_openai_deltas_and_a_message() {
    let q = crate::chat::reply::QUOTE;
    let (deltas, called, warnings) = reply(
        setup(ToolChoice::Auto, "<|turn>model\n"),
        &[
            "<|channel>thought\nPar",
            "is.<channel|>On it.<|tool_",
            &format!("call>call:get_weather{{city:{q}Paris{q}}}<tool_call|>"),
            "<|tool_call>call:x{}<tool_call|>",
        ],
    );
    assert!(called);
    assert_eq!(warnings.len(), 1, "the second call, left out without parallel_tool_calls: {warnings:?}");
    let m = reply_message(&deltas);
    assert_eq!(m["reasoning_content"], "Paris.");
    assert_eq!(m["content"], "On it.");
    assert_eq!(
        m["tool_calls"],
        json!([{"id": "call_7_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}])
    );
    assert_eq!(deltas[0], json!({"reasoning_content": "Par"}), "reasoning streams as it comes");
    // A named choice pins the call's start; the reply continues it.
    let (deltas, called, _) = reply(setup(ToolChoice::Named("get_weather".into()), "x"), &[&format!("city:{q}Rome{q}}}<tool_call|>")]);
    assert!(called);
    assert_eq!(reply_message(&deltas)["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Rome\"}");
    assert!(reply_message(&deltas)["content"].is_null());
    // After a tool response with thinking on, the reply starts in the channel; "required" closes it.
    let s = setup(ToolChoice::Required, "<tool_response|><|channel>thought\n");
    assert_eq!(s.pinned, "<channel|><|tool_call>call:");
    let (deltas, called, _) = reply(s, &["f{}<tool_call|>"]);
    assert!(called && reply_message(&deltas).get("reasoning_content").is_none());
    // tool_choice none: a call's text is content.
    let (deltas, called, _) = reply(setup(ToolChoice::None, "x"), &["<|tool_call>call:f{}<tool_call|>"]);
    assert!(!called);
    assert_eq!(reply_message(&deltas)["content"], "<|tool_call>call:f{}<tool_call|>");
    // A call that does not parse: content, and a warning.
    let (deltas, called, warnings) = reply(setup(ToolChoice::Auto, "x"), &["<|tool_call>call:f{a:}<tool_call|>"]);
    assert!(!called && warnings[0].contains("does not parse"));
    assert_eq!(reply_message(&deltas)["content"], "<|tool_call>call:f{a:}<tool_call|>");
}

/// Every conversation of `fixtures/chat-tools` sent in OpenAI's shape (each call's arguments a
/// JSON string, as clients send them) renders, through the request's checks and decoding, to the
/// prompt transformers rendered.
#[test]
fn openai_shaped_conversations_render_as_transformers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let template = crate::chat::ChatTemplate::from_dir(&root.join("converter-gemma4-vocab/hf")).unwrap().unwrap();
    let text = std::fs::read_to_string(root.join("chat-tools/conversations.jsonl")).unwrap();
    for line in text.lines() {
        let mut case: Value = serde_json::from_str(line).unwrap();
        for m in case["messages"].as_array_mut().unwrap() {
            for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
                let args = &mut c["function"]["arguments"];
                if !args.is_null() {
                    *args = Value::String(args.to_string());
                }
            }
        }
        let request = json!({"messages": case["messages"], "tools": case["tools"], "chat_template_kwargs": case["kwargs"]});
        let chat = chat(request.as_object().unwrap()).unwrap_or_else(|e| panic!("{}: {}", case["name"], e.message));
        let tools = (!chat.tools.is_empty()).then_some(chat.tools.as_slice());
        let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let conversation = crate::chat::Conversation { messages: &chat.messages, tools, kwargs: &chat.kwargs, add_generation_prompt };
        assert_eq!(template.render_conversation(&conversation).unwrap(), case["text"].as_str().unwrap(), "{}", case["name"]);
    }
}
