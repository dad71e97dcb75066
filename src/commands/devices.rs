//! `kiln devices`: the CPU and every GPU adapter.
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let report = kiln::runtime::list_devices();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("cpu      {} ({} threads; {})", report.cpu.name, report.cpu.threads, report.cpu.simd.join(", "));
    if report.adapters.is_empty() {
        println!("no GPU adapters (on Linux without a GPU: apt-get install -y mesa-vulkan-drivers libvulkan1)");
    }
    for a in &report.adapters {
        println!(
            "gpu:{}    {} [{} {}{}] driver {} {}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            if a.software { ", software" } else { "" },
            a.driver,
            a.driver_info
        );
        println!(
            "         max binding {} MiB, max buffer {} MiB, {} invocations/workgroup, {} KiB workgroup memory, {} storage buffers/stage",
            a.max_storage_buffer_binding_size >> 20,
            a.max_buffer_size >> 20,
            a.max_compute_invocations_per_workgroup,
            a.max_compute_workgroup_storage_size >> 10,
            a.max_storage_buffers_per_shader_stage
        );
        println!("         features: {}", if a.features.is_empty() { "-".to_string() } else { a.features.join(", ") });
    }
    Ok(())
}
