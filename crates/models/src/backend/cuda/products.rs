//! The products: float and block-format weights on the Triton kernels (decode-shaped tiles and
//! split-K for few rows, wide tiles for many), or on the vendor library (`vendor.rs`) for many
//! rows of a half-precision weight; the MLP's gated down product.
//!
//! Invariant: how many ranges a split-K product takes depends on the weight's shape only,
//! never on the batch.

use super::*;

/// How the kernels read a weight type: a float element type, or a block format.
#[derive(Debug, Clone, Copy)]
pub(super) enum Form {
    Float(&'static str),
    Blocks(&'static str),
}

pub(super) fn form(dtype: DType) -> Result<Form> {
    Ok(match dtype {
        DType::F32 => Form::Float("f32"),
        DType::F16 => Form::Float("f16"),
        DType::BF16 => Form::Float("bf16"),
        DType::Q8_0 => Form::Blocks("q8_0"),
        DType::Q4_0 => Form::Blocks("q4_0"),
        DType::Q4_1 => Form::Blocks("q4_1"),
        DType::Q5_0 => Form::Blocks("q5_0"),
        DType::Q5_1 => Form::Blocks("q5_1"),
        DType::Q4_K => Form::Blocks("q4_k"),
        DType::Q5_K => Form::Blocks("q5_k"),
        DType::Q6_K => Form::Blocks("q6_k"),
    })
}

impl CudaBackend {
    /// The columns per range of a split-K decode product of `w` ([`DecodeSplit`]), when it
    /// splits into two ranges or more.
    pub(super) fn split_columns(&self, name: &str, w: &GpuWeight) -> Result<Option<usize>> {
        let tiles = w
            .rows
            .div_ceil(self.block(name, "BLOCK_N")?.max(1) as usize);
        let s = self.decode_split;
        let splits = (s.programs / tiles.max(1)).min(w.cols / s.min_k);
        if splits < 2 {
            return Ok(None);
        }
        // Ranges of whole decode tiles (256 columns) where `min_k` allows, and always of whole
        // blocks of a block format.
        let align = s.min_k.min(256).max(w.dtype.block_size());
        let per = w.cols.div_ceil(splits).next_multiple_of(align);
        Ok((w.cols.div_ceil(per) >= 2).then_some(per))
    }

    /// The split-K product kernel of `w`'s type (without the gated suffix).
    pub(super) fn split_name(w: &GpuWeight) -> Result<String> {
        Ok(match form(w.dtype)? {
            Form::Float(f) => format!("gemm_{f}_split"),
            Form::Blocks(q) => format!("qgemm_{q}_split"),
        })
    }

    /// `y[m, w.rows] = x[m, w.cols] @ w^T` in ranges of `per` columns, one launch: each
    /// range's partial, added in range order into `y` by the last range of its output tile
    /// to finish (one range writes `y` itself). With `gated`, the left operand is
    /// `act(x) * up` (the MLP's down product, from `Gate` and `Up`, `up` at `x`'s stride).
    /// Float and block-format weights alike; a block format's ranges are whole blocks
    /// ([`Self::split_columns`]). `x` and `y` are pointers with their row strides (elements).
    pub(super) fn gemm_split(
        &mut self,
        ((x, x_stride), (y, y_stride)): ((DevicePtr, usize), (DevicePtr, usize)),
        w: &GpuWeight,
        m: usize,
        per: usize,
        gated: Option<(DevicePtr, GatedAct)>,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        let splits = k.div_ceil(per.max(1));
        let (up, suffix) = match gated {
            None => (x, ""),
            Some((up, GatedAct::Silu)) => (up, "_silu"),
            Some((up, GatedAct::GeluTanh)) => (up, "_gelu"),
        };
        let name = format!("{}{suffix}", Self::split_name(w)?);
        let grid = [
            cdiv(m, self.block(&name, "BLOCK_M")?),
            cdiv(n, self.block(&name, "BLOCK_N")?),
            splits as u32,
        ];
        // One range writes `y` and reads neither buffer: `y` stands in for both.
        let (part, counts) = if splits == 1 {
            (y, y)
        } else {
            let tiles = grid[0] as usize * grid[1] as usize;
            (
                self.gemm_part.ensure(&self.gpu, 4 * splits * m * n)?,
                self.split_counts.ensure_zeroed(&self.gpu, 4 * tiles)?,
            )
        };
        let (mm, nn) = (i32_arg(m, "rows")?, i32_arg(n, "weight rows")?);
        let kk = i32_arg(k, "weight columns")?;
        let mut args = args![
            x_ptr: p(x),
            up_ptr: p(up),
            w_ptr: p(w.buf.ptr()),
            part_ptr: p(part),
            y_ptr: p(y),
            count_ptr: p(counts),
            m: mm,
            n: nn,
            k: kk,
        ]
        .to_vec();
        if let Form::Blocks(_) = form(w.dtype)? {
            args.push(("row_bytes", i32_arg(w.row_bytes, "row bytes")?));
        }
        args.extend(args![
            x_stride: i32_arg(x_stride, "row stride")?,
            k_per_split: i32_arg(per, "columns per range")?,
            y_stride: i32_arg(y_stride, "row stride")?,
            splits: i32_arg(splits, "ranges")?,
        ]);
        let launched = self.launch(&name, grid, &args);
        if launched.is_err() && splits > 1 {
            // Some ranges may have counted and none zeroed: the counts start afresh.
            self.split_counts = Grown::default();
        }
        launched
    }

    /// `y[m, w.rows] = x[m, w.cols] @ w^T`; `x` and `y` are pointers with their row strides
    /// (elements).
    pub(super) fn gemm(
        &mut self,
        (x, x_stride): (DevicePtr, usize),
        w: &GpuWeight,
        (y, y_stride): (DevicePtr, usize),
        m: usize,
    ) -> Result<()> {
        if m <= self.dispatch.decode_m {
            if let Some(per) = self.split_columns(&Self::split_name(w)?, w)? {
                return self.gemm_split(((x, x_stride), (y, y_stride)), w, m, per, None);
            }
        } else if self.vendor_gemm((x, x_stride), w, (y, y_stride), m, None)? {
            return Ok(());
        }
        let (xs, ys) = (
            i32_arg(x_stride, "row stride")?,
            i32_arg(y_stride, "row stride")?,
        );
        let (mm, n, k) = (
            i32_arg(m, "rows")?,
            i32_arg(w.rows, "weight rows")?,
            i32_arg(w.cols, "weight columns")?,
        );
        // Decode-shaped products (few rows) take the narrow, deep tiles made for reading the
        // weights at bandwidth with one activation row (kernels/specs.py).
        // Long prefill chunks of a half-precision weight take wide, pipelined tiles.
        let decode = if m <= self.dispatch.decode_m {
            "_decode"
        } else {
            ""
        };
        let (name, args) = match form(w.dtype)? {
            Form::Float(f) => (
                match (m, f) {
                    (m, _) if m <= self.dispatch.decode_m => format!("gemm_{f}_decode"),
                    (m, "f16" | "bf16") if m > self.dispatch.large_m => format!("gemm_{f}_large"),
                    _ => format!("gemm_{f}_bias0"),
                },
                args![
                    x_ptr: p(x),
                    w_ptr: p(w.buf.ptr()),
                    bias_ptr: p(DevicePtr::NULL),
                    y_ptr: p(y),
                    m: mm,
                    n: n,
                    k: k,
                    x_stride: xs,
                    y_stride: ys,
                ]
                .to_vec(),
            ),
            Form::Blocks(q) => (
                format!("qgemm_{q}{decode}"),
                args![
                    x_ptr: p(x),
                    w_ptr: p(w.buf.ptr()),
                    y_ptr: p(y),
                    m: mm,
                    n: n,
                    k: k,
                    row_bytes: i32_arg(w.row_bytes, "row bytes")?,
                    x_stride: xs,
                    y_stride: ys,
                ]
                .to_vec(),
            ),
        };
        let grid = [
            cdiv(m, self.block(&name, "BLOCK_M")?),
            cdiv(w.rows, self.block(&name, "BLOCK_N")?),
            1,
        ];
        self.launch(&name, grid, &args)
    }

    pub(super) fn gated_linear_impl(
        &mut self,
        w: &GpuWeight,
        act: GatedAct,
        out: Buf,
    ) -> Result<()> {
        let n = self.dims.intermediate;
        let kernel = match act {
            GatedAct::Silu => "gated_silu",
            GatedAct::GeluTanh => "gated_gelu_tanh",
        };
        let (gate, up) = (self.buf(Buf::Gate)?, self.buf(Buf::Up)?);
        // Gate and Up share their slot's stride ([`place`]).
        let stride = self.stride(Buf::Gate);
        let y = (self.buf(out)?, self.stride(out));
        // Few rows: the activation inside the (split-K) down product.
        if self.tokens <= self.dispatch.decode_m {
            let per = self
                .split_columns(&Self::split_name(w)?, w)?
                .unwrap_or(w.cols);
            let t = self.tokens;
            return self.gemm_split(((gate, stride), y), w, t, per, Some((up, act)));
        }
        // Many rows of a half weight: act(Gate) * Up rounded into the vendor product's input.
        if self.vendor_gemm((gate, stride), w, y, self.tokens, Some((up, stride, act)))? {
            return Ok(());
        }
        let grid = [self.tokens as u32, cdiv(n, self.block(kernel, "BLOCK")?), 1];
        // In place: Gate = act(Gate) * Up.
        let args = args![
            gate_ptr: p(gate),
            up_ptr: p(up),
            out_ptr: p(gate),
            n: i32_arg(n, "intermediate size")?,
            gate_stride: i32_arg(stride, "row stride")?,
            up_stride: i32_arg(stride, "row stride")?,
            out_stride: i32_arg(stride, "row stride")?,
        ];
        self.launch(kernel, grid, &args)?;
        self.gemm((gate, stride), w, y, self.tokens)
    }
}
