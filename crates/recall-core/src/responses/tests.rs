use serde_json::{json, Map, Value};

use super::completion::Completion;
use super::ids;
use super::request::{translate, Translated};
use super::response::{of_completion, Echo};
use crate::error::RequestError;
use crate::memory::message::parse_messages;

fn body(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn ok(v: Value) -> Translated {
    let t = translate(body(v)).unwrap();
    // Whatever comes out is what chat's own reading makes of it.
    let written = serde_json::to_value(&t.messages).unwrap();
    let read = parse_messages(written.as_array().unwrap().clone()).unwrap();
    assert_eq!(read, t.messages);
    assert!(!t.chat.contains_key("messages"));
    t
}

/// The messages as chat writes them.
fn messages(t: &Translated) -> Value {
    serde_json::to_value(&t.messages).unwrap()
}

fn refused(v: Value) -> (String, Option<String>) {
    match translate(body(v)) {
        Err(RequestError::Invalid { message, param, .. }) => (message, param),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
    let t = ok(json!({"model": "m", "instructions": "Be brief.", "input": "hi"}));
    assert_eq!(
        messages(&t),
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(t.chat["model"], "m");
    assert!(t.store && !t.stream);
    assert_eq!((t.previous_response_id, t.conversation), (None, None));
}

#[test]
fn items_become_chat_messages_in_order() {
    let t = ok(json!({"model": "m", "input": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "and look:"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "c3", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c3", "output": "fog"}
    ]}));
    let call = |id: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": "weather", "arguments": args}});
    assert_eq!(
        messages(&t),
        json!([
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"role": "user", "content": [
                {"type": "text", "text": "and look:"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}]},
            // The reply's text and the calls after it are one message.
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                call("c1", "{\"city\":\"Paris\"}"), call("c2", "{\"city\":\"Rome\"}")]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "rain"},
            {"role": "assistant", "content": null, "tool_calls": [call("c3", "{}")]},
            {"role": "tool", "tool_call_id": "c3", "content": "fog"}
        ])
    );
}

#[test]
fn options_are_mapped_and_the_rest_passes_through() {
    let t = ok(json!({
        "model": "m", "input": "hi", "stream": true, "store": false,
        "tools": [{"type": "function", "name": "weather", "description": "d",
                   "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
        "max_output_tokens": 50, "reasoning": {"effort": "low"},
        "temperature": 0.2, "top_p": 0.9, "user": "u1", "parallel_tool_calls": false,
        "include": ["reasoning.encrypted_content"], "truncation": "auto",
        "metadata": {"k": "v"}, "seed": 7,
        "conversation": {"id": "conv_1"}
    }));
    assert_eq!(
        Value::Object(t.chat.clone()),
        json!({
            "model": "m", "stream": true, "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "weather", "description": "d",
                       "parameters": {"type": "object"}, "strict": true}}],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "response_format": {"type": "json_schema", "json_schema":
                {"name": "out", "schema": {"type": "object"}, "strict": true}},
            "max_tokens": 50, "reasoning_effort": "low",
            "temperature": 0.2, "top_p": 0.9, "user": "u1", "parallel_tool_calls": false,
            "seed": 7
        })
    );
    assert!(!t.store && t.stream);
    assert_eq!(t.conversation.as_deref(), Some("conv_1"));
    assert_eq!(t.metadata, Some(json!({"k": "v"})));
}

#[test]
fn what_a_chat_upstream_cannot_do_is_refused_by_name() {
    let cases = [
        (
            json!({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}),
            "tools[0]",
            "web_search",
        ),
        (
            json!({"model": "m", "input": "hi", "background": true}),
            "background",
            "background",
        ),
        (
            json!({"model": "m", "input": "hi", "previous_response_id": "resp_1", "conversation": "c"}),
            "previous_response_id",
            "together",
        ),
        (
            json!({"model": "m", "input": [{"type": "computer_call", "id": "x"}]}),
            "input[0]",
            "computer_call",
        ),
        (
            json!({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
            "item references",
        ),
        (
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
            "input[0]",
            "image_url",
        ),
        (
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]}),
            "input[0]",
            "input_file",
        ),
        (
            json!({"model": "m", "input": [{"role": "tool", "content": "x"}]}),
            "input[0]",
            "role",
        ),
        (
            json!({"model": "m", "input": [{"type": "function_call", "call_id": "c"}]}),
            "input[0]",
            "name",
        ),
        (json!({"model": "m", "input": 5}), "input", "string"),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            "messages",
            "`input`",
        ),
        (
            json!({"model": "m", "input": "hi", "messages": "x"}),
            "messages",
            "chat completions",
        ),
        (
            json!({"model": "m", "input": "hi", "tool_choice": {"type": "file_search"}}),
            "tool_choice",
            "function",
        ),
        (
            json!({"model": "m", "input": "hi", "store": "yes"}),
            "store",
            "boolean",
        ),
    ];
    for (request, param, says) in cases {
        let (message, p) = refused(request.clone());
        assert_eq!(p.as_deref(), Some(param), "{request}: {message}");
        assert!(message.contains(says), "{request}: {message}");
    }
}

#[test]
fn a_completion_becomes_a_response_with_stable_item_ids() {
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "mock-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me check.",
            "tool_calls": [{"id": "call_a", "type": "function",
                            "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                  "prompt_tokens_details": {"cached_tokens": 4}}
    });
    let echo = Echo {
        id: "resp_abc".into(),
        items: "abc".into(),
        created_at: 1700000000,
        previous_response_id: Some("resp_prev".into()),
        instructions: Some("Be brief.".into()),
        store: true,
        ..Echo::default()
    };
    let r = from_completion(&completion, &echo);
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "mock-model");
    assert_eq!(r["previous_response_id"], "resp_prev");
    assert_eq!(
        r["output"],
        json!([
            {"type": "message", "id": "msg_abc_0", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
            {"type": "function_call", "id": "fc_abc_0", "status": "completed", "call_id": "call_a",
             "name": "weather", "arguments": "{\"city\":\"Paris\"}"}
        ])
    );
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4},
               "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 17})
    );
    assert_eq!(r, from_completion(&completion, &echo), "ids are not stable");
    assert_eq!(ids::item("msg", "abc", 3), "msg_abc_3");
}

/// The Response for a completion, as the answer writes it.
fn from_completion(completion: &Value, echo: &Echo) -> Value {
    let bytes = serde_json::to_vec(completion).unwrap();
    let mut spare = Vec::new();
    let c = Completion::read(&bytes, &mut spare).unwrap();
    written(&c, echo)
}

/// The Response for a read completion, as written, read back.
fn written(c: &Completion, echo: &Echo) -> Value {
    let mut out = Vec::new();
    of_completion(c, echo).write(&mut out).unwrap();
    serde_json::from_slice(&out).unwrap()
}

/// Every field of a Response, in OpenAI's order, the echo's defaults
/// where the request left a field out, and text that needs escaping
/// written so that it reads back.
#[test]
fn a_response_is_written_whole_in_order() {
    let completion = br#"{"model":"m","choices":[{"finish_reason":"stop",
        "message":{"role":"assistant","content":"a \"quoted\" line\n"}}],
        "usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
    let mut spare = Vec::new();
    let c = Completion::read(completion, &mut spare).unwrap();
    let echo = Echo {
        id: "resp_s_k".into(),
        items: "s_1".into(),
        created_at: 7,
        conversation: Some("conv \"1\"".into()),
        instructions: Some("Say \"hi\".\n".into()),
        store: true,
        ..Echo::default()
    };
    let mut out = Vec::new();
    of_completion(&c, &echo).write(&mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        concat!(
            r#"{"id":"resp_s_k","object":"response","created_at":7,"status":"completed","#,
            r#""error":null,"incomplete_details":null,"model":"m","output":[{"type":"message","#,
            r#""id":"msg_s_1_0","status":"completed","role":"assistant","content":[{"type":"#,
            r#""output_text","text":"a \"quoted\" line\n","annotations":[]}]}],"usage":"#,
            r#"{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"#,
            r#""output_tokens_details":{"reasoning_tokens":0},"total_tokens":5},"#,
            r#""previous_response_id":null,"conversation":{"id":"conv \"1\""},"#,
            r#""instructions":"Say \"hi\".\n","metadata":{},"store":true,"tools":[],"#,
            r#""tool_choice":"auto","temperature":1.0,"top_p":1.0,"parallel_tool_calls":true,"#,
            r#""text":{"format":{"type":"text"}},"max_output_tokens":null,"#,
            r#""truncation":"disabled","reasoning":null,"user":null}"#
        )
    );
    // What the request gave is echoed as it gave it.
    let mut fields = Map::new();
    for (k, v) in [
        ("tools", json!([{"type": "function", "name": "f"}])),
        ("temperature", json!(0.5)),
        ("user", json!("u\"1")),
        ("text", json!({"format": {"type": "json_object"}})),
    ] {
        fields.insert(k.into(), v);
    }
    let echo = Echo {
        fields: fields.clone(),
        metadata: Some(json!({"k": "v\u{1}"})),
        store: false,
        ..echo
    };
    let r = written(&c, &echo);
    for (k, v) in &fields {
        assert_eq!(&r[k], v, "{k}");
    }
    assert_eq!(r["metadata"], json!({"k": "v\u{1}"}));
    assert_eq!(
        (r["store"].clone(), r["top_p"].clone()),
        (json!(false), json!(1.0))
    );
}

#[test]
fn a_cut_completion_is_an_incomplete_response() {
    let completion = json!({"model": "m", "choices": [{"finish_reason": "length",
        "message": {"role": "assistant", "content": "It was a dark and"}}]});
    let r = from_completion(
        &completion,
        &Echo {
            id: "resp_x".into(),
            ..Echo::default()
        },
    );
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(r["usage"], Value::Null);
    assert_eq!(r["output"][0]["content"][0]["text"], "It was a dark and");
}

/// JSON allows a repeated key, and a `Value` reading keeps the last one:
/// a completion that repeats one is a Response, not a 500.
#[test]
fn a_completion_that_repeats_a_key_is_read_with_the_last_one() {
    let echo = Echo {
        id: "resp_x".into(),
        items: "x".into(),
        ..Echo::default()
    };
    let bodies = [
        r#"{"model": "a", "model": "b", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"total_tokens": 1}, "usage": {"total_tokens": 2}}"#,
        r#"{"model": "b", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "no", "content": "hi"}}],
            "usage": {"total_tokens": 2, "total_tokens": 2}}"#,
    ];
    for body in bodies {
        let mut spare = Vec::new();
        let c = Completion::read(body.as_bytes(), &mut spare).unwrap();
        let r = written(&c, &echo);
        assert_eq!(r["model"], "b", "{body}");
        assert_eq!(r["output"][0]["content"][0]["text"], "hi", "{body}");
        assert_eq!(r["usage"]["total_tokens"], 2, "{body}");
    }
    // A lone surrogate in a field this reading skips, beside a message
    // that is not an object: the `Value` reading refuses the body, so
    // the first reading stands (an empty output, not a 500).
    let odd = r#"{"id": "\ud800", "model": "m", "choices": [{"message": "odd"}]}"#;
    let mut spare = Vec::new();
    let c = Completion::read(odd.as_bytes(), &mut spare).unwrap();
    let r = written(&c, &echo);
    assert_eq!(
        (r["model"].as_str(), r["output"].clone()),
        (Some("m"), json!([]))
    );
    let mut spare = Vec::new();
    assert!(Completion::read(b"{\"choices\": [", &mut spare).is_err());
    // Where no whole reading takes the body (a lone surrogate or a number
    // past f64 inside a part a typed reading looks into), each part is
    // read on its own: what reads is kept, the rest left out.
    let message = r#"{"choices": [{"message": {"content": "hi"}}]"#;
    for (odd, usage) in [
        (r#""usage": "\ud800""#, None),
        (r#""usage": {"\ud800": 1, "total_tokens": 2}"#, None),
        (r#""usage": {"total_tokens": 1e400}"#, Some(0)),
        (r#""usage": {"total_tokens": 4}, "x": [1e400]"#, Some(4)),
    ] {
        let body = format!("{message}, {odd}}}");
        let mut spare = Vec::new();
        let c = Completion::read(body.as_bytes(), &mut spare).expect(&body);
        let r = written(&c, &echo);
        assert_eq!(r["output"][0]["content"][0]["text"], "hi", "{body}");
        assert_eq!(r["usage"]["total_tokens"].as_u64(), usage, "{body}");
    }
    let body =
        r#"{"choices": [{"message": {"content": "\ud800", "content": "hi"}}], "u": "\ud800"}"#;
    let mut spare = Vec::new();
    let r = written(
        &Completion::read(body.as_bytes(), &mut spare).unwrap(),
        &echo,
    );
    assert_eq!(r["output"], json!([]));
}

/// Where the relay found a completion's parts, the Response written from
/// them is the one the whole reading writes; a part that does not read on
/// its own as the whole reading takes it sends the body to that reading.
#[test]
fn a_completion_read_from_the_relay_s_parts_is_the_one_read_whole() {
    use crate::exchange::accumulate::completion_read;
    let echo = Echo {
        id: "resp_x".into(),
        items: "x".into(),
        ..Echo::default()
    };
    let taken = [
        r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,
            "message":{"role":"assistant","content":"Hello \"there\"\n"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":10,"completion_tokens":8,"total_tokens":18,
            "prompt_tokens_details":{"cached_tokens":4},
            "completion_tokens_details":{"reasoning_tokens":2}}}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}},
            {"id":"call_2","type":"function","function":{"name":"g","arguments":"{\"a\":1}"}}]},
            "finish_reason":"tool_calls"}],"model":null,"usage":5}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":"","refusal":"No."},
            "finish_reason":"content_filter"}],"usage":{"total_tokens":-1}}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":"cut"},"finish_reason":"length"}],
            "usage":{"total_tokens":2},"model":"a","model":"b","usage":{"total_tokens":3}}"#,
        r#"{"choices":[{"message":{"role":"assistant","content":"hi","annotations":[]},"finish_reason":null}],
            "x":"\ud800","usage":{"prompt_tokens":1.5,"total_tokens":1e400}}"#,
    ];
    for body in taken {
        let read = completion_read(body.as_bytes(), true).expect(body);
        let mut spares = Default::default();
        let from_parts =
            Completion::of_parts(body.as_bytes(), &read.parts, &mut spares).expect(body);
        let mut spare = Vec::new();
        let whole = Completion::read(body.as_bytes(), &mut spare).unwrap();
        assert_eq!(
            written(&from_parts, &echo),
            written(&whole, &echo),
            "{body}"
        );
    }
    // A message or usage that repeats a key keeps the last one, as the
    // whole reading does.
    let body = r#"{"choices":[{"message":{"role":"assistant","content":"no","content":"hi"}}],
        "usage":{"total_tokens":1,"total_tokens":2}}"#;
    let read = completion_read(body.as_bytes(), true).unwrap();
    let mut spares = Default::default();
    let c = Completion::of_parts(body.as_bytes(), &read.parts, &mut spares).unwrap();
    let r = written(&c, &echo);
    assert_eq!(r["output"][0]["content"][0]["text"], "hi");
    assert_eq!(r["usage"]["total_tokens"], 2);
    let mut spare = Vec::new();
    let whole = Completion::read(body.as_bytes(), &mut spare).unwrap();
    assert_eq!(r, written(&whole, &echo));
    // Choice 0 by its index, as the record has it.
    let body = r#"{"choices":[{"index":1,"message":{"role":"assistant","content":"no"}},
        {"index":0,"message":{"role":"assistant","content":"yes"}}]}"#;
    let read = completion_read(body.as_bytes(), true).unwrap();
    let mut spares = Default::default();
    let c = Completion::of_parts(body.as_bytes(), &read.parts, &mut spares).unwrap();
    assert_eq!(written(&c, &echo)["output"][0]["content"][0]["text"], "yes");
}

/// Chat's usage is read typed from its raw JSON, to the same numbers a
/// `Value` reading gave: whole and not negative, else 0.
#[test]
fn chat_usage_reads_as_a_value_reads_it() {
    use super::usage::usage;
    let cases = [
        r#"{"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}"#,
        r#"{"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16,
            "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 2, "audio_tokens": 0}}"#,
        r#"{"prompt_tokens": 1.0, "completion_tokens": -3, "total_tokens": 1e2}"#,
        r#"{"prompt_tokens": 18446744073709551616, "total_tokens": 18446744073709551615}"#,
        r#"{"prompt_tokens": "7", "completion_tokens": null, "total_tokens": true}"#,
        r#"{"prompt_tokens_details": [4], "completion_tokens_details": "x"}"#,
        r#"{"prompt_tokens_details": {"cached_tokens": 1, "cached_tokens": 5}}"#,
        r#"{"total_tokens": 1, "total_tokens": 9}"#,
        r#"{"prompt_tokens": -0, "extra": {"deep": [1, {"a": 2}]}}"#,
        r#"{}"#,
        r#"[10, 6, 16]"#,
        r#"16"#,
        r#"null"#,
    ];
    let read = |usage: &str| {
        let body =
            format!(r#"{{"choices": [{{"message": {{"content": "hi"}}}}], "usage": {usage}}}"#);
        let mut spare = Vec::new();
        let usage = Completion::read(body.as_bytes(), &mut spare).unwrap().usage;
        usage
    };
    for raw in cases {
        let value: Value = serde_json::from_str(raw).unwrap();
        assert_eq!(read(raw), usage(&value), "{raw}");
    }
    // A field not read is skipped unchecked, as the completion's are.
    let odd = read(r#"{"total_tokens": 3, "note": "\ud800"}"#);
    assert_eq!(serde_json::to_value(odd).unwrap()["total_tokens"], 3);
}

/// The answer is read from raw JSON: escaped text goes out as it came,
/// and what a `Value` reading tolerated still is (a `null` or non-string
/// content, an odd message in another choice, usage numbers that are not
/// integers).
#[test]
fn a_completion_is_read_from_its_raw_json_as_leniently_as_before() {
    let echo = Echo {
        id: "resp_x".into(),
        items: "x".into(),
        ..Echo::default()
    };
    let text = "a \"quoted\" line\n\u{e9}t\u{e9} \\ end";
    let r = from_completion(
        &json!({"model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text, "refusal": null}},
            {"index": 1, "message": "odd"}],
            "usage": {"prompt_tokens": 3.5, "completion_tokens": 2, "total_tokens": "x"}}),
        &echo,
    );
    assert_eq!(
        r["output"][0]["content"],
        json!([{"type": "output_text", "text": text, "annotations": []}])
    );
    assert_eq!(r["output"].as_array().unwrap().len(), 1);
    assert_eq!(r["usage"]["input_tokens"], 0);
    assert_eq!(r["usage"]["output_tokens"], 2);
    for message in [
        json!({"role": "assistant", "content": null}),
        json!({"content": 7}),
        json!("odd"),
        json!([{"content": "in a list"}, 1]),
        json!(true),
        json!(-1.5),
        Value::Null,
    ] {
        let r = from_completion(&json!({"choices": [{"message": message}]}), &echo);
        assert_eq!(r["output"], json!([]), "{message}");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], Value::Null);
    }
    // Calls of odd shapes give items with what they have, as before.
    let odd = json!({"choices": [{"message": {"content": null,
        "tool_calls": [{"id": "c", "function": "f"}, "x"]}}]});
    let r = from_completion(&odd, &echo);
    let calls: Vec<_> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["type"].clone(), i["call_id"].clone(), i["name"].clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (json!("function_call"), json!("c"), Value::Null),
            (json!("function_call"), Value::Null, Value::Null)
        ]
    );
}

mod stream {
    use super::super::events::Events;
    use super::super::response::Echo;
    use crate::exchange::accumulate::{Delta, Event};
    use serde_json::{json, Value};

    fn chunk(delta: Value, finish: Option<&str>) -> Delta {
        parsed(
            json!({"object": "chat.completion.chunk", "model": "mock-model",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    }

    fn parsed(v: Value) -> Delta {
        match Event::parse(&v.to_string()) {
            Event::Chunk(d) => d,
            other => panic!("not a chunk: {other:?}"),
        }
    }

    /// The SSE a stream wrote, event by event, checking the framing.
    fn events(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (kind, data) = e.split_once('\n').unwrap();
                let v: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(kind.strip_prefix("event: ").unwrap(), v["type"]);
                v
            })
            .collect()
    }

    fn echo() -> Echo {
        Echo {
            id: "resp_s".into(),
            items: "s".into(),
            created_at: 1,
            store: true,
            ..Echo::default()
        }
    }

    fn kinds(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    /// A delta's event, written by hand, byte for byte: text with
    /// something to escape, and a refusal's, which has no `logprobs`.
    #[test]
    fn delta_events_are_written_whole() {
        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.chunk(&chunk(json!({"content": "a \"b\"\n"}), None), &mut out);
        let text = String::from_utf8(out).unwrap();
        let last = text.split("\n\n").filter(|e| !e.is_empty()).last().unwrap();
        assert_eq!(
            last,
            concat!(
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",",
                r#""item_id":"msg_s_0","output_index":0,"content_index":0,"delta":"a \"b\"\n","#,
                r#""logprobs":[],"sequence_number":2}"#
            )
        );
        let mut out = Vec::new();
        s.chunk(&chunk(json!({"refusal": "no"}), None), &mut out);
        let text = String::from_utf8(out).unwrap();
        let last = text.split("\n\n").filter(|e| !e.is_empty()).last().unwrap();
        assert_eq!(
            last,
            concat!(
                "event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",",
                r#""item_id":"msg_s_0","output_index":0,"content_index":1,"delta":"no","#,
                r#""sequence_number":4}"#
            )
        );
    }

    #[test]
    fn text_then_calls_stream_in_the_order_the_sdks_expect() {
        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.start(&mut out);
        let chunks = [
            chunk(json!({"role": "assistant", "content": ""}), None),
            chunk(json!({"content": "Let me "}), None),
            chunk(json!({"content": "check."}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                       "function": {"name": "weather", "arguments": ""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
                None,
            ),
            chunk(json!({}), Some("tool_calls")),
            parsed(json!({"object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})),
        ];
        for c in &chunks {
            s.chunk(c, &mut out);
        }
        s.finish(&mut out);
        let all = events(&out);
        assert_eq!(
            kinds(&all),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (n, e) in all.iter().enumerate() {
            assert_eq!(e["sequence_number"], n as u64, "{e}");
        }
        assert_eq!(all[0]["response"]["status"], "in_progress");
        assert_eq!(
            all[4],
            json!({"type": "response.output_text.delta", "item_id": "msg_s_0", "output_index": 0,
                   "content_index": 0, "delta": "Let me ", "logprobs": [], "sequence_number": 4})
        );
        assert_eq!(all[6]["text"], "Let me check.");
        assert_eq!(all[11]["delta"], "\"Paris\"}");
        assert_eq!(all[12]["arguments"], "{\"city\":\"Paris\"}");
        let done = &all[14]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["usage"]["total_tokens"], 13);
        assert_eq!(
            done["output"],
            json!([
                {"type": "message", "id": "msg_s_0", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                {"type": "function_call", "id": "fc_s_0", "call_id": "call_a", "name": "weather",
                 "arguments": "{\"city\":\"Paris\"}", "status": "completed"}
            ])
        );
        // The same items as the non-streaming Response would have.
        assert_eq!(all[13]["item"], done["output"][1]);
    }

    #[test]
    fn a_cut_stream_ends_incomplete_with_what_was_relayed() {
        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.start(&mut out);
        s.chunk(&chunk(json!({"content": "Once upon"}), None), &mut out);
        s.incomplete("interrupted", &mut out);
        let all = events(&out);
        let last = all.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "interrupted"
        );
        assert_eq!(
            last["response"]["output"][0]["content"][0]["text"],
            "Once upon"
        );
        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.start(&mut out);
        s.failed("upstream_error", "the upstream broke off", &mut out);
        let failed = &events(&out)[2];
        assert_eq!(failed["type"], "response.failed");
        assert_eq!(failed["response"]["error"]["code"], "upstream_error");
        assert_eq!(failed["sequence_number"], 2);
    }

    #[test]
    fn a_limit_reached_is_an_incomplete_response() {
        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.start(&mut out);
        s.chunk(
            &chunk(json!({"content": "It was"}), Some("length")),
            &mut out,
        );
        s.finish(&mut out);
        let all = events(&out);
        let last = all.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }

    #[test]
    fn a_refusal_streams_as_a_refusal_part_and_text_after_calls_is_another_item() {
        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.start(&mut out);
        s.chunk(&chunk(json!({"refusal": "I can't "}), None), &mut out);
        s.chunk(
            &chunk(json!({"refusal": "help with that."}), None),
            &mut out,
        );
        s.chunk(&chunk(json!({}), Some("stop")), &mut out);
        s.finish(&mut out);
        let all = events(&out);
        assert_eq!(
            kinds(&all)[2..],
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.refusal.delta",
                "response.refusal.delta",
                "response.refusal.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(all[4]["delta"], "I can't ");
        assert!(all[4].get("logprobs").is_none());
        assert_eq!(
            all[9]["response"]["output"][0]["content"],
            json!([{"type": "refusal", "refusal": "I can't help with that."}])
        );

        let mut s = Events::new(echo(), "m");
        let mut out = Vec::new();
        s.start(&mut out);
        s.chunk(&chunk(json!({"content": "before"}), None), &mut out);
        s.chunk(
            &chunk(
                json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
                None,
            ),
            &mut out,
        );
        s.chunk(&chunk(json!({"content": "after"}), None), &mut out);
        s.chunk(
            &chunk(json!({"content": " and more"}), Some("stop")),
            &mut out,
        );
        s.finish(&mut out);
        let all = events(&out);
        let output = &all.last().unwrap()["response"]["output"];
        let ids: Vec<&str> = output
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["msg_s_0", "fc_s_0", "msg_s_1"]);
        assert_eq!(output[2]["content"][0]["text"], "after and more");
    }
}
