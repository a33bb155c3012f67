
TEST_CASE("the grokking section's figures are seed 0's progress measures in the committed results") {
  // docs/experiments/grokking/seed0-fourier-*.svg: seed 0's run (weight decay 1) as `qkv inspect DIR
  // --fourier --svg` draws it, from what the grokking measurement keeps of each kept step in
  // results.json (every number the figures read). With QKV_WRITE_DOCS=1, written where they differ.
  const std::filesystem::path dir = std::filesystem::path(QKV_SOURCE_DIR) / "docs" / "experiments" / "grokking";
  std::ifstream in(dir / "results.json");
  REQUIRE(in);
  const nlohmann::json results = nlohmann::json::parse(in);
  const nlohmann::json* seed0 = nullptr;
  for (const auto& run : results.at("runs"))
    if (run.at("seed") == 0 && run.at("labels").at("decay") == "1") seed0 = &run;
  REQUIRE(seed0);
  const nlohmann::json& g = seed0->at("grokking");
  analysis::FourierRun r;
  r.dir = "grokking, seed 0 (weight decay 1)";
  r.final.p = seed0->at("config").at("n").get<std::size_t>();  // modadd's size, p
  r.final.key_frequencies = g.at("key_frequencies").get<std::vector<std::size_t>>();
  for (const auto& point : g.at("along")) {
    analysis::FourierAnalysis a;
    a.train_loss = point.at("train_loss"), a.test_loss = point.at("test_loss");
    a.restricted_loss = point.at("restricted_loss"), a.excluded_loss = point.at("excluded_loss");
    a.weight_norm = point.at("weight_norm");
    a.embed = point.at("embed").get<std::vector<double>>();
    r.steps.push_back(point.at("step").get<std::size_t>());
    r.along.push_back(std::move(a));
  }
  const auto charts = report::fourier_charts(r);
  REQUIRE(charts.size() == 4);
  const char* write_docs = std::getenv("QKV_WRITE_DOCS");
  for (const auto& [name, svg] : charts) {
    INFO(name);
    const std::filesystem::path path = dir / ("seed0-" + name + ".svg");
    std::ifstream file_in(path);
    const std::string committed((std::istreambuf_iterator<char>(file_in)), std::istreambuf_iterator<char>());
    CHECK(committed == svg);
    if (write_docs && std::string(write_docs) == "1" && committed != svg) nn::write_atomically(path.string(), svg);
  }
}
