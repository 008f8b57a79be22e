//! `config.json` validation: every broken field is named in the error.

use dsv4_engine::model::ModelConfig;
use serde_json::Value;

fn golden_config() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tiny-v4-small/quant/config.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("read config")).expect("json")
}

fn error_for(edit: impl FnOnce(&mut Value)) -> String {
    let mut v = golden_config();
    edit(&mut v);
    match ModelConfig::from_json_str(&v.to_string(), "config.json") {
        Ok(_) => panic!("config accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn golden_config_parses_with_mtp_ratio_and_quantization() {
    let cfg =
        ModelConfig::from_json_str(&golden_config().to_string(), "config.json").expect("valid");
    assert_eq!(cfg.compress_ratios.len(), cfg.num_hidden_layers + 1);
    assert!(cfg.has_mtp());
    assert_eq!(
        cfg.linear_format,
        dsv4_engine::model::LinearFormat::Fp8 { block: 128 }
    );
    assert_eq!(cfg.expert_format, dsv4_engine::model::ExpertFormat::Fp4);
    assert!(cfg.yarn.is_some());
}

#[test]
fn each_broken_field_is_named() {
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "compress_ratios",
            Box::new(|v| v["compress_ratios"][1] = 3.into()),
        ),
        (
            "compress_ratios",
            Box::new(|v| v["compress_ratios"] = serde_json::json!([0, 4])),
        ),
        ("o_groups", Box::new(|v| v["o_groups"] = 3.into())),
        (
            "hidden_size",
            Box::new(|v| {
                v.as_object_mut().map(|o| o.remove("hidden_size"));
            }),
        ),
        ("model_type", Box::new(|v| v["model_type"] = "llama".into())),
        (
            "num_experts_per_tok",
            Box::new(|v| v["num_experts_per_tok"] = 99.into()),
        ),
        (
            "quantization_config.weight_block_size",
            Box::new(|v| {
                v["quantization_config"]["weight_block_size"] = serde_json::json!([64, 64])
            }),
        ),
        (
            "expert_dtype",
            Box::new(|v| v["expert_dtype"] = "int3".into()),
        ),
        (
            "rope_scaling.type",
            Box::new(|v| v["rope_scaling"]["type"] = "linear".into()),
        ),
        (
            "qk_rope_head_dim",
            Box::new(|v| v["qk_rope_head_dim"] = 33.into()),
        ),
        ("vocab_size", Box::new(|v| v["vocab_size"] = "big".into())),
    ];
    for (field, edit) in cases {
        let msg = error_for(edit);
        assert!(
            msg.contains(&format!("`{field}`")),
            "expected field {field} in: {msg}"
        );
        assert!(msg.starts_with("config.json"), "{msg}");
    }
}

#[test]
fn malformed_json_names_the_file() {
    let err =
        ModelConfig::from_json_str("{ not json", "/models/x/config.json").expect_err("malformed");
    assert!(err.to_string().contains("/models/x/config.json"));
}
