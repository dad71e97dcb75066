//! The CPU's instruction-set extensions, detected once per process and cached: the one
//! place kernels ask which code paths they may take (AVX2 + FMA loops today; AVX-512,
//! VNNI and AMX kernels for a tuner to choose from tomorrow) and that `kiln devices`
//! reports. Nothing else in kiln calls `is_x86_feature_detected!`.
use std::sync::OnceLock;

/// Instruction-set extensions of the CPU running this process (all `false` on other
/// architectures than the field's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    pub sse42: bool,
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512dq: bool,
    /// 8-bit dot products on 512-bit registers (`vpdpbusd`).
    pub avx512vnni: bool,
    pub avx512bf16: bool,
    pub avx512fp16: bool,
    /// VEX-encoded VNNI on 256-bit registers (Alder Lake and later).
    pub avxvnni: bool,
    /// AMX tiles with int8 and bf16 products, as reported by CPUID. The OS must also
    /// grant the tile state to the process (on Linux `arch_prctl(ARCH_REQ_XCOMP_PERM)`)
    /// before a kernel may use them.
    pub amx_tile: bool,
    pub amx_int8: bool,
    pub amx_bf16: bool,
    /// The vendor is Intel (CPUID's "GenuineIntel"): some kernels' defaults differ
    /// between Intel and AMD cores of the same instruction set.
    pub intel: bool,
    /// Arm Advanced SIMD.
    pub neon: bool,
    /// Arm 8-bit dot products (`sdot`/`udot`).
    pub dotprod: bool,
}

impl CpuFeatures {
    /// The features of this CPU (detected on the first call, then cached).
    pub fn get() -> &'static CpuFeatures {
        static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
        FEATURES.get_or_init(CpuFeatures::detect)
    }

    /// Detects the features now (prefer [`CpuFeatures::get`]).
    pub fn detect() -> CpuFeatures {
        #[allow(unused_mut)]
        let mut f = CpuFeatures::default();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            f.sse42 = has!("sse4.2");
            f.avx = has!("avx");
            f.avx2 = has!("avx2");
            f.fma = has!("fma");
            f.f16c = has!("f16c");
            f.avx512f = has!("avx512f");
            f.avx512bw = has!("avx512bw");
            f.avx512vl = has!("avx512vl");
            f.avx512dq = has!("avx512dq");
            f.avx512vnni = has!("avx512vnni");
            f.avx512bf16 = has!("avx512bf16");
            f.avx512fp16 = has!("avx512fp16");
            f.avxvnni = has!("avxvnni");
            // CPUID leaf 7, sub-leaf 0, EDX: AMX-BF16 (22), AMX-TILE (24), AMX-INT8 (25).
            // Leaf 7 exists when the maximum basic leaf (leaf 0's EAX) reaches it.
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            let leaf0 = __cpuid(0);
            f.intel = (leaf0.ebx, leaf0.edx, leaf0.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e);
            let edx = if leaf0.eax >= 7 { __cpuid_count(7, 0).edx } else { 0 };
            f.amx_bf16 = edx & (1 << 22) != 0;
            f.amx_tile = edx & (1 << 24) != 0;
            f.amx_int8 = edx & (1 << 25) != 0;
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            f.neon = has!("neon");
            f.dotprod = has!("dotprod");
        }
        f
    }

    /// AVX2 with FMA: the 8-lane f32 kernels (`#[target_feature(enable = "avx2,fma")]`).
    pub fn avx2_fma(&self) -> bool {
        self.avx2 && self.fma
    }

    /// The AVX-512 subset that 16-lane f32/int kernels need (F, BW, VL, DQ).
    pub fn avx512(&self) -> bool {
        self.avx512f && self.avx512bw && self.avx512vl && self.avx512dq
    }

    /// The names of the features present, in the order of the fields (for reports).
    pub fn names(&self) -> Vec<&'static str> {
        let all = [
            (self.sse42, "sse4.2"),
            (self.avx, "avx"),
            (self.avx2, "avx2"),
            (self.fma, "fma"),
            (self.f16c, "f16c"),
            (self.avx512f, "avx512f"),
            (self.avx512bw, "avx512bw"),
            (self.avx512vl, "avx512vl"),
            (self.avx512dq, "avx512dq"),
            (self.avx512vnni, "avx512vnni"),
            (self.avx512bf16, "avx512bf16"),
            (self.avx512fp16, "avx512fp16"),
            (self.avxvnni, "avxvnni"),
            (self.amx_tile, "amx-tile"),
            (self.amx_int8, "amx-int8"),
            (self.amx_bf16, "amx-bf16"),
            (self.neon, "neon"),
            (self.dotprod, "dotprod"),
        ];
        all.into_iter().filter(|(on, _)| *on).map(|(_, n)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::CpuFeatures;

    #[test]
    fn detection_is_cached_and_consistent() {
        let f = CpuFeatures::get();
        assert!(std::ptr::eq(f, CpuFeatures::get()));
        assert_eq!(*f, CpuFeatures::detect());
        // Extensions imply their base.
        assert!(!f.avx2 || f.avx);
        assert!(!f.avx512bw || f.avx512f);
        assert_eq!(f.names().contains(&"avx2"), f.avx2);
    }
}
