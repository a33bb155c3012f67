#include "qkv/report/explore.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/report/heatmap.hpp"

namespace qkv::report {

namespace {

// A weight in [0, 1] as two characters of this alphabet (4,096 levels: within 1.3e-4), "~~" for a
// masked cell; the page's script reads them back.
constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string packed(const Array<double>& w) {
  std::string out;
  out.reserve(2 * w.size());
  for (const double v : w) {
    if (!std::isfinite(v)) {
      out += "~~";
      continue;
    }
    const long q = std::lround(std::clamp(v, 0.0, 1.0) * 4095);
    out += digits[q / 64];
    out += digits[q % 64];
  }
  return out;
}


constexpr const char* explore_script_text = R"js((function () {
  const data = JSON.parse(document.getElementById('explore-data').textContent);
  const T = data.tokens.length, digits = data.digits;
  const headSelect = document.getElementById('explore-head'), slider = document.getElementById('explore-step');
  const picture = document.getElementById('explore-picture'), about = document.getElementById('explore-about');
  const attends = [...document.querySelectorAll('#explore-attends span')];
  const attended = [...document.querySelectorAll('#explore-attended span')];
  const hoverText = document.getElementById('explore-hover');
  const decoded = new Map();
  let hovered = null;
  const weights = () => {
    const key = slider.value + '/' + headSelect.value;
    if (!decoded.has(key)) {
      const s = data.steps[+slider.value].attention[+headSelect.value], w = new Float64Array(T * T);
      for (let i = 0; i < T * T; i++)
        w[i] = s[2 * i] === '~' ? NaN : (digits.indexOf(s[2 * i]) * 64 + digits.indexOf(s[2 * i + 1])) / 4095;
      decoded.set(key, w);
    }
    return decoded.get(key);
  };
  const name = i => i + ' (' + data.tokens[i] + ')';
  const shade = (v, rgb) => isNaN(v) ? 'transparent' : 'rgba(' + rgb + ',' + v.toFixed(3) + ')';
  function recolour() {
    const w = weights();
    for (const spans of [attends, attended]) for (const s of spans) s.classList.toggle('hovered', +s.dataset.i === hovered);
    if (hovered === null) {
      for (const s of attends.concat(attended)) s.style.background = 'transparent';
      hoverText.textContent = 'Hover a token, or a row of the picture.';
      return;
    }
    let top = null, by = null;
    for (let j = 0; j < T; j++) {
      const out = w[hovered * T + j], into = w[j * T + hovered];
      attends[j].style.background = shade(out, '33,102,172');
      attended[j].style.background = shade(into, '214,96,77');
      if (!isNaN(out) && (top === null || out > w[hovered * T + top])) top = j;
      if (!isNaN(into) && (by === null || into > w[by * T + hovered])) by = j;
    }
    hoverText.textContent = 'query ' + name(hovered) + (top === null ? ' attends nothing' :
      ' attends most to key ' + name(top) + ': ' + w[hovered * T + top].toFixed(3)) + '; ' +
      (by === null ? 'no query attends it' : 'the query attending it most is ' + name(by) + ': ' + w[by * T + hovered].toFixed(3));
  }
  // The picture, built element by element: a token's name is text, never markup.
  const svgNS = 'http://www.w3.org/2000/svg';
  const element = (tag, attributes) => {
    const e = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
    return e;
  };
  function draw() {
    const w = weights(), cell = Math.max(6, Math.min(18, Math.floor(480 / T))), size = cell * T;
    const step = data.steps[+slider.value], when = step.step === null ? 'the trained model' : 'step ' + step.step;
    const svg = element('svg', {width: size + 2, height: size + 2, role: 'img', 'aria-label': 'attention'});
    const g = svg.appendChild(element('g', {transform: 'translate(1,1)'}));
    for (let q = 0; q < T; q++)
      for (let k = 0; k < T; k++) {
        const v = w[q * T + k];
        const r = g.appendChild(element('rect', {x: k * cell, y: q * cell, width: cell, height: cell, 'data-q': q,
                                                 fill: isNaN(v) ? '#ddd' : shade(v, '33,102,172')}));
        r.appendChild(element('title', {})).textContent =
          'query ' + name(q) + ' → key ' + name(k) + ': ' + (isNaN(v) ? 'masked' : v.toFixed(3));
        r.addEventListener('mouseenter', () => { hovered = q; recolour(); });
      }
    g.appendChild(element('rect', {width: size, height: size, fill: 'none', stroke: '#999'}));
    picture.replaceChildren(svg);
    document.getElementById('explore-step-label').textContent =
      when + (data.steps.length > 1 ? ' (' + (+slider.value + 1) + ' of ' + data.steps.length + ')' : '');
    about.textContent = headSelect.options[headSelect.selectedIndex].text + ' at ' + when + ': σ ' +
      step.sigma[+headSelect.value].toFixed(3) + '. Rows are queries, columns keys; grey is masked.';
    recolour();
  }
  for (const s of attends.concat(attended)) s.addEventListener('mouseenter', () => { hovered = +s.dataset.i; recolour(); });
  headSelect.addEventListener('change', draw);
  slider.addEventListener('input', draw);
  draw();
})();
)js";

}  // namespace

std::vector<std::size_t> explore_steps(std::size_t steps, std::size_t bytes_per_step) {
  const std::size_t fit = std::max<std::size_t>(1, max_explore_bytes / std::max<std::size_t>(1, bytes_per_step));
  std::vector<std::size_t> kept;
  if (steps <= fit) {
    for (std::size_t i = 0; i < steps; ++i) kept.push_back(i);
    return kept;
  }
  if (fit == 1) return {steps - 1};
  for (std::size_t k = 0; k < fit; ++k) {
    const std::size_t i = std::size_t(std::llround(double(k) * double(steps - 1) / double(fit - 1)));
    if (kept.empty() || kept.back() != i) kept.push_back(i);
  }
  return kept;
}

std::size_t explore_bytes_per_step(std::size_t layers, std::size_t heads, std::size_t length) {
  return 2 * layers * heads * length * length;
}

std::string explore_html(const analysis::Inspection& in) {
  const std::size_t L = in.layers.size(), H = L ? in.layers[0].size() : 0, T = in.input.size();
  std::vector<analysis::StepAttention> steps = in.along_training;
  std::string source = steps.empty() ? "the model as inspected" : "";
  if (steps.empty()) {
    analysis::StepAttention now;
    for (const auto& heads : in.layers) {
      now.attention.emplace_back();
      now.sigma.emplace_back();
      for (const auto& h : heads) {
        now.attention.back().push_back(analysis::masked_weights(h.attention, h.scores));
        now.sigma.back().push_back(h.sigma);
      }
    }
    steps.push_back(std::move(now));
  }
  const std::vector<std::size_t> kept = explore_steps(steps.size(), explore_bytes_per_step(L, H, T));
  nlohmann::json data = {{"tokens", in.input_names}, {"digits", digits}, {"steps", nlohmann::json::array()}};
  for (const std::size_t i : kept) {
    nlohmann::json attention = nlohmann::json::array(), sigma = nlohmann::json::array();
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t h = 0; h < H; ++h) {
        attention.push_back(packed(steps[i].attention.at(l).at(h)));
        sigma.push_back(steps[i].sigma.at(l).at(h));
      }
    // The trained model alone, when the run kept no steps: no step to name.
    data["steps"].push_back({{"step", in.along_training.empty() ? nlohmann::json() : nlohmann::json(steps[i].step)},
                             {"attention", std::move(attention)},
                             {"sigma", std::move(sigma)}});
  }
  std::string s = "<h2 id=\"explore\">Explore</h2>\n<section class=\"explore\">\n<p class=\"legend\">Pick a head; hover a token, or a row "
                  "of the picture, to see where that query attends (blue, the upper strip) and which queries attend it "
                  "(red, the lower strip)";
  if (!in.along_training.empty())
    s += fmt::format("; the slider moves along training, over {} {} of the run's {} {}, and redraws the picture, the strips "
                     "and σ at that step",
                     kept.size() == steps.size() ? "all" : "an even choice of", kept.size(), steps.size(),
                     escape_xml(in.along_training_from));
  else
    s += "; the run kept no steps along training (<code>qkv train --keep-checkpoints log</code> keeps them), so the "
         "slider has the trained model alone";
  s += ".</p>\n<p><label>head <select id=\"explore-head\">";
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h)
      s += fmt::format("<option value=\"{}\">{}</option>", l * H + h, head_label(l, h));
  s += fmt::format("</select></label> <label>step <input type=\"range\" id=\"explore-step\" min=\"0\" max=\"{0}\" "
                   "value=\"{0}\"></label> <span id=\"explore-step-label\"></span></p>\n",
                   kept.size() - 1);
  const auto strip = [&](const char* id, const char* title) {
    std::string t = fmt::format("<div class=\"strip\" id=\"{}\"><b>{}</b> ", id, title);
    for (std::size_t i = 0; i < T; ++i)
      t += fmt::format("<span data-i=\"{}\" title=\"position {}\">{}</span> ", i, i, escape_xml(in.input_names[i]));
    return t + "</div>\n";
  };
  s += strip("explore-attends", "attends to:");
  s += strip("explore-attended", "attended by:");
  s += "<p id=\"explore-hover\"></p>\n<p id=\"explore-about\" class=\"legend\"></p>\n<div id=\"explore-picture\"></div>\n"
       "</section>\n";
  return s + json_script("explore-data", data);
}

std::string explore_script() { return explore_script_text; }

}  // namespace qkv::report
