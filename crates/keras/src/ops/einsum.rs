//! `keras.ops.einsum` of two operands (KerasHub's attention: `"bquh,bkuh->buqk"`), as one
//! batched matrix product, the way TensorFlow computes it: each operand's axes sorted into
//! batch, free and contracted groups, the groups flattened, one `matmul`, the result unflattened
//! and put in the output's order. Letters only one operand has and the output lacks are summed
//! first.

use crate::value::{DynTensor, Reduce};
use model::error::Result;

#[derive(Debug, Clone)]
pub struct Einsum {
    subscripts: String,
    a: Vec<char>,
    b: Vec<char>,
    out: Vec<char>,
}

impl Einsum {
    /// `"ab,bc->ac"`: two operands and an explicit output, each letter once per operand.
    pub fn parse(subscripts: &str) -> std::result::Result<Self, String> {
        let compact: String = subscripts.chars().filter(|c| !c.is_whitespace()).collect();
        let (inputs, out) = compact.split_once("->").ok_or("an explicit output (`->`) is needed")?;
        let (a, b) = inputs.split_once(',').ok_or("two operands are supported")?;
        if b.contains(',') {
            return Err("two operands are supported".into());
        }
        let letters = |part: &str| -> std::result::Result<Vec<char>, String> {
            if part.contains('.') {
                return Err("ellipses (`...`) are not supported".into());
            }
            let letters: Vec<char> = part.chars().collect();
            if let Some(bad) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
                return Err(format!("{bad:?} is not a letter"));
            }
            if let Some(twice) = letters.iter().find(|c| letters.iter().filter(|d| d == c).count() > 1) {
                return Err(format!("{twice:?} repeats within one term (diagonals are not supported)"));
            }
            Ok(letters)
        };
        let (a, b, out) = (letters(a)?, letters(b)?, letters(out)?);
        if let Some(lost) = out.iter().find(|c| !a.contains(c) && !b.contains(c)) {
            return Err(format!("the output's {lost:?} is in neither operand"));
        }
        Ok(Self { subscripts: compact, a, b, out })
    }

    pub fn subscripts(&self) -> &str {
        &self.subscripts
    }

    /// The product of `a` and `b`.
    pub fn run(&self, a: DynTensor, b: DynTensor) -> Result<DynTensor> {
        let (sa, sb) = (a.shape(), b.shape());
        let shape_error = |which: &str, letters: &[char], shape: &[usize]| model::error::ModelError::InputShape {
            input: "einsum",
            expected: format!("{} axes for {which} ({})", letters.len(), letters.iter().collect::<String>()),
            found: shape.to_vec(),
        };
        if sa.len() != self.a.len() {
            return Err(shape_error("the first operand", &self.a, &sa));
        }
        if sb.len() != self.b.len() {
            return Err(shape_error("the second operand", &self.b, &sb));
        }
        let size = |c: char| -> usize {
            self.a
                .iter()
                .position(|&l| l == c)
                .map_or_else(|| sb[self.b.iter().position(|&l| l == c).unwrap_or(0)], |i| sa[i])
        };
        for (i, c) in self.b.iter().enumerate() {
            if let Some(j) = self.a.iter().position(|l| l == c)
                && sa[j] != sb[i]
            {
                return Err(model::error::ModelError::InputShape {
                    input: "einsum",
                    expected: format!("{} entries along {c:?}, as the first operand has", sa[j]),
                    found: sb.clone(),
                });
            }
        }
        let in_a = |c: &char| self.a.contains(c);
        let in_b = |c: &char| self.b.contains(c);
        let in_out = |c: &char| self.out.contains(c);
        let batch: Vec<char> = self.out.iter().copied().filter(|c| in_a(c) && in_b(c)).collect(); // [batch...]
        let a_free: Vec<char> = self.out.iter().copied().filter(|c| in_a(c) && !in_b(c)).collect(); // [m...]
        let b_free: Vec<char> = self.out.iter().copied().filter(|c| in_b(c) && !in_a(c)).collect(); // [n...]
        let contracted: Vec<char> = self.a.iter().copied().filter(|c| in_b(c) && !in_out(c)).collect(); // [k...]

        // Letters one operand alone has and the output lacks: summed away first.
        let sum_alone = |x: DynTensor, own: &[char], other: &dyn Fn(&char) -> bool| -> Result<(DynTensor, Vec<char>)> {
            let summed: Vec<usize> = (0..own.len()).filter(|&i| !other(&own[i]) && !in_out(&own[i])).collect();
            let kept: Vec<char> = own.iter().copied().filter(|c| other(c) || in_out(c)).collect();
            if summed.is_empty() { Ok((x, kept)) } else { Ok((x.reduce(Reduce::Sum, &summed, false)?, kept)) }
        };
        let (a, a_letters) = sum_alone(a, &self.a, &in_b)?;
        let (b, b_letters) = sum_alone(b, &self.b, &in_a)?;

        let count = |letters: &[char]| letters.iter().map(|&c| size(c)).product::<usize>();
        let (nb, m, n, k) = (count(&batch), count(&a_free), count(&b_free), count(&contracted));
        let order = |letters: &[char], groups: [&[char]; 3]| -> Vec<usize> {
            groups.iter().flat_map(|g| g.iter()).map(|c| letters.iter().position(|l| l == c).unwrap_or(0)).collect()
        };
        let a = a.permute(&order(&a_letters, [&batch, &a_free, &contracted]))?.reshape(&[nb, m, k])?; // [nb, m, k]
        let b = b.permute(&order(&b_letters, [&batch, &contracted, &b_free]))?.reshape(&[nb, k, n])?; // [nb, k, n]
        let product = DynTensor::matmul(a, b)?; // [nb, m, n]

        let grouped: Vec<char> = batch.iter().chain(&a_free).chain(&b_free).copied().collect();
        let sizes: Vec<usize> = grouped.iter().map(|&c| size(c)).collect();
        let product = product.reshape(if sizes.is_empty() { &[1] } else { &sizes })?; // [batch..., m..., n...]
        if grouped.is_empty() {
            return Ok(product);
        }
        product.permute(&order(&grouped, [&self.out, &[], &[]])) // [out...]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::DynTensor;
    use model::weights::HostTensor;

    fn tensor(shape: &[usize], seed: f32) -> DynTensor {
        let count = shape.iter().product::<usize>();
        let data = (0..count).map(|i| ((i as f32 * 0.37 + seed).sin() * 2.0).round() / 2.0).collect();
        DynTensor::from_host(&HostTensor::new(shape.to_vec(), data), &burn::tensor::Device::flex()).unwrap()
    }

    /// The sum over every letter not in the output, written out loop by loop.
    fn naive(equation: &str, a: &HostTensor, b: &HostTensor) -> HostTensor {
        let e = Einsum::parse(equation).unwrap();
        let mut letters: Vec<char> = e.a.iter().chain(&e.b).copied().collect();
        letters.sort_unstable();
        letters.dedup();
        let size = |c: char| {
            e.a.iter()
                .position(|&l| l == c)
                .map_or_else(|| b.shape[e.b.iter().position(|&l| l == c).unwrap()], |i| a.shape[i])
        };
        let out_shape: Vec<usize> = e.out.iter().map(|&c| size(c)).collect();
        let mut out = vec![0.0; out_shape.iter().product()];
        let total: usize = letters.iter().map(|&c| size(c)).product();
        let flat = |letters_of: &[char], shape: &[usize], at: &dyn Fn(char) -> usize| {
            letters_of.iter().zip(shape).fold(0, |acc, (&c, &s)| acc * s + at(c))
        };
        for mut index in 0..total {
            let mut value = std::collections::HashMap::new();
            for &c in letters.iter().rev() {
                value.insert(c, index % size(c));
                index /= size(c);
            }
            let at = |c: char| value[&c];
            out[flat(&e.out, &out_shape, &at)] += a.data[flat(&e.a, &a.shape, &at)] * b.data[flat(&e.b, &b.shape, &at)];
        }
        HostTensor::new(out_shape, out)
    }

    #[test]
    fn two_operand_products_match_the_sum_written_out() {
        for (equation, sa, sb) in [
            ("bquh,bkuh->buqk", vec![2, 3, 4, 5], vec![2, 6, 4, 5]), // Llama's scores
            ("buqk,bkuh->bquh", vec![2, 4, 3, 6], vec![2, 6, 4, 5]), // and its weighted values
            ("aecd,abcd->acbe", vec![2, 3, 4, 5], vec![2, 6, 4, 5]), // Keras' MultiHeadAttention
            ("btkgh,bskh->bkgts", vec![2, 3, 2, 2, 4], vec![2, 5, 2, 4]), // Gemma's grouped heads
            ("ij,jk->ki", vec![3, 4], vec![4, 2]),
            ("ij,kj->", vec![3, 4], vec![2, 4]),
            ("ij,jk->i", vec![3, 4], vec![4, 2]), // k summed alone
            ("i,j->ij", vec![3], vec![4]),
        ] {
            let (a, b) = (tensor(&sa, 0.1), tensor(&sb, 0.7));
            let want = naive(equation, &a.to_host(), &b.to_host());
            let got = Einsum::parse(equation).unwrap().run(a, b).unwrap().to_host();
            let want_shape = if want.shape.is_empty() { vec![1] } else { want.shape.clone() };
            assert_eq!(got.shape, want_shape, "{equation}");
            let worst = got.data.iter().zip(&want.data).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-5, "{equation}: {worst}");
        }
    }

    #[test]
    fn what_is_not_supported_is_named() {
        assert!(Einsum::parse("ij,jk").unwrap_err().contains("explicit output"));
        assert!(Einsum::parse("...j,jk->...k").unwrap_err().contains("ellipses"));
        assert!(Einsum::parse("ii,ij->j").unwrap_err().contains("repeats"));
        assert!(Einsum::parse("ij,jk,kl->il").unwrap_err().contains("two operands"));
        assert!(Einsum::parse("ij,jk->iz").unwrap_err().contains("neither"));
    }
}
