//! `kiln ops`: the operators Kiln implements, or with `--dtypes` its element types.
use anyhow::Result;
use kiln::graph::DType;

#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON list of {domain, op} objects instead of one op per line.
    #[arg(long)]
    json: bool,
    /// List the element types instead: Kiln's name, the ONNX code, and what runs on them.
    #[arg(long)]
    dtypes: bool,
}

fn dtypes(json: bool) -> Result<()> {
    let rows: Vec<(DType, &str)> = DType::ALL
        .iter()
        .chain(&[DType::String])
        .map(|&d| {
            (d, if d.is_narrow() {
                "Cast, CastLike, QuantizeLinear, DequantizeLinear, reshapes"
            } else if d.is_string() {
                "string ops, LabelEncoder, ArrayFeatureExtractor, TfIdfVectorizer, Equal, Cast, CastLike, Concat, Shape, Size, reshapes (on the host)"
            } else {
                "every op that takes the type"
            })
        })
        .collect();
    if json {
        let list: Vec<serde_json::Value> = rows.iter().map(|(d, ops)| serde_json::json!({"dtype": d.name(), "onnx": d.onnx_code(), "ops": ops})).collect();
        println!("{}", serde_json::to_string(&list)?);
    } else {
        for (d, ops) in &rows {
            println!("{:<11} {:>2}  {ops}", d.name(), d.onnx_code());
        }
    }
    Ok(())
}

pub fn main(args: Args) -> Result<()> {
    if args.dtypes {
        return dtypes(args.json);
    }
    let mut ops: Vec<(&str, &str)> = kiln::ops::Registry::builtin().op_types().collect();
    ops.sort();
    if args.json {
        let list: Vec<serde_json::Value> = ops.iter().map(|(d, o)| serde_json::json!({"domain": if d.is_empty() { "ai.onnx" } else { d }, "op": o})).collect();
        println!("{}", serde_json::to_string(&list)?);
    } else {
        for (d, o) in &ops {
            if d.is_empty() {
                println!("{o}");
            } else {
                println!("{d}.{o}");
            }
        }
        eprintln!("{} operators", ops.len());
    }
    Ok(())
}
