//! The soak's request mix: request `i` is a pure function of the seed and `i`, so a failing run
//! can be repeated request for request.
//!
//! Each request picks, from its own splitmix64 stream: the endpoint (chat or completions), `n`
//! in 1..=3, `max_tokens` in 1..=64, zero to three stop strings, streamed or not (a stream
//! always asks for its usage chunk), `ignore_eos` or not, and whether and when its client walks
//! away (after 1 to 4 stream chunks, or 5 to 304 ms into a plain request). The prompt is
//! `bench serve`'s generator at a random length of 1..=`max_input_len` tokens (exact with a
//! tokenizer, else approximate); a quarter of the prompts start with one of two shared
//! preambles, so that prefix-cache hits, and blocks shared between requests, are part of the
//! mix.

use super::check::Endpoint;
use crate::serve::prompts::{self, Rng};
use anyhow::Result;
use ferrum_tokenizer::Tokenizer;
use serde_json::{json, Value};

const STOPS: &[&str] = &["\n", ".", " the", ",", "!"];

/// Two preambles longer than a KV block (16 tokens by default), shared between prompts.
const PREAMBLES: &[&str] = &[
    "You are a careful assistant. Answer briefly, in plain words, and say so when you do not \
     know the answer to a question. Here is the question:",
    "The following is a short story about a river, a city and the people who lived between \
     them for seven hundred years. It begins like this:",
];

/// One request of the mix.
#[derive(Debug, Clone)]
pub struct Plan {
    pub endpoint: Endpoint,
    pub n: usize,
    pub stream: bool,
    pub body: Value,
    /// Walk away: after this many stream chunks, or after this many milliseconds.
    pub disconnect: Option<u64>,
}

/// What request `i` of the soak looks like.
pub fn plan(
    seed: u64,
    i: usize,
    model: &str,
    disconnect_fraction: f64,
    max_input_len: usize,
    tokenizer: Option<&Tokenizer>,
) -> Result<Plan> {
    let mut r = Rng::for_index(seed, i);
    let input_len = 1 + r.below(max_input_len as u64) as usize;
    let mut text = prompts::prompt(seed, i, input_len, tokenizer)?.text;
    if r.below(4) == 0 {
        let pre = PREAMBLES[r.below(PREAMBLES.len() as u64) as usize];
        text = format!("{pre} {text}");
    }
    let endpoint = if r.below(2) == 0 {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let n = 1 + r.below(3) as usize;
    let stream = r.below(2) == 0;
    let mut body = json!({
        "model": model,
        "max_tokens": 1 + r.below(64),
        "n": n,
        "stream": stream,
        "temperature": 0.8,
        "seed": i,
    });
    match endpoint {
        Endpoint::Chat => body["messages"] = json!([{"role": "user", "content": text}]),
        Endpoint::Completions => body["prompt"] = json!(text),
    }
    let stops = r.below(4) as usize;
    if stops > 0 {
        let list: Vec<&str> = (0..stops)
            .map(|_| STOPS[r.below(STOPS.len() as u64) as usize])
            .collect();
        body["stop"] = json!(list);
    }
    if r.below(2) == 0 {
        body["ignore_eos"] = json!(true);
    }
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    let disconnect = (r.unit() < disconnect_fraction).then(|| {
        if stream {
            1 + r.below(4)
        } else {
            5 + r.below(300)
        }
    });
    Ok(Plan {
        endpoint,
        n,
        stream,
        body,
        disconnect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(seed: u64, frac: f64) -> Vec<Plan> {
        (0..400)
            .map(|i| plan(seed, i, "m", frac, 32, None).expect("plan"))
            .collect()
    }

    #[test]
    fn the_mix_is_seeded_and_covers_every_kind() {
        let (a, b) = (plans(3, 0.2), plans(3, 0.2));
        assert!(a.iter().zip(&b).all(|(x, y)| x.body == y.body));
        assert!(a.iter().zip(plans(4, 0.2)).any(|(x, y)| x.body != y.body));
        let count = |f: &dyn Fn(&Plan) -> bool| a.iter().filter(|p| f(p)).count();
        assert!(count(&|p| p.endpoint == Endpoint::Chat) > 100);
        assert!(count(&|p| p.endpoint == Endpoint::Completions) > 100);
        assert!(count(&|p| p.stream) > 100 && count(&|p| !p.stream) > 100);
        for n in 1..=3 {
            assert!(count(&|p| p.n == n) > 50, "n={n}");
        }
        assert!(count(&|p| p.body.get("stop").is_some()) > 100);
        assert!(count(&|p| p.body.get("ignore_eos").is_some()) > 100);
        let disconnects = count(&|p| p.disconnect.is_some());
        assert!((40..=120).contains(&disconnects), "{disconnects}");
        assert!(a.iter().all(|p| {
            let m = p.body["max_tokens"].as_u64().unwrap_or(0);
            (1..=64).contains(&m) && p.body["n"] == p.n
        }));
        let shared = count(&|p| {
            let t = p.body["prompt"]
                .as_str()
                .or(p.body["messages"][0]["content"].as_str())
                .unwrap_or_default();
            PREAMBLES.iter().any(|pre| t.starts_with(pre))
        });
        assert!((50..=150).contains(&shared), "{shared}");
        assert!(plans(3, 0.0).iter().all(|p| p.disconnect.is_none()));
        assert!(plans(3, 1.0).iter().all(|p| p.disconnect.is_some()));
    }
}
