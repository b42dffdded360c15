package lakehouse.ingest;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * The typed record of a JSON payload that certainly passes every rule of a contract that
 * does not depend on the time, else null (the typed fast path of
 * service/ingest/fast_path.py, which writes the spec).
 *
 * <p>A record only when the exact validation (Spark expressions over a VARIANT) would find
 * no error and read the same typed values: one JSON object, no duplicate keys, every key a
 * declared property, every value of a declared JSON type and within its rules, no number
 * whose reading could differ (beyond 64 bits, not finite, more than 15 significant digits;
 * a zero written without an exponent reads as an unsigned zero, as there), no UTF-16
 * surrogate. Null sends the record to the exact validation, which decides it. The
 * record's columns are the spec's, in its order; a date-time's is its text (an ISO-8601
 * string, or the epoch milliseconds as digits).
 */
public final class FastCheck implements UDF1<String, Row> {
  private static final long serialVersionUID = 1L;
  private static final JsonFactory JSON =
      JsonFactory.builder().enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION).build();
  private static final Pattern ISO_TIMESTAMP =
      Pattern.compile(
          "^\\d{4}-\\d{2}-\\d{2}[T ]\\d{2}:\\d{2}:\\d{2}(\\.\\d{1,9})?(Z|[+-]\\d{2}(:?\\d{2})?)?\\z");
  private static final long MIN_EPOCH_MILLIS = -62_135_596_800_000L;
  private static final long MAX_EPOCH_MILLIS = 253_402_300_799_999L;
  private static final int MAX_DIGITS = 15;

  private final String spec;
  private transient Node root;

  /** A checker of the contract {@code spec} (JSON, written by fast_path.py). */
  public FastCheck(String spec) {
    this.spec = spec;
    this.root = parseSpec(spec);
  }

  @Override
  public Row call(String payload) {
    if (payload == null) {
      return null;
    }
    if (root == null) {
      root = parseSpec(spec);
    }
    Object document;
    try (JsonParser parser = JSON.createParser(payload)) {
      if (parser.nextToken() != JsonToken.START_OBJECT) {
        return null;
      }
      document = readObject(parser);
      if (document == null || parser.nextToken() != null) {
        return null;
      }
    } catch (IOException | RuntimeException e) {
      return null;
    }
    @SuppressWarnings("unchecked")
    Map<String, Object> members = (Map<String, Object>) document;
    return root.objectHolds(members) && conditionalsHold(members) ? root.row(members) : null;
  }

  // ---- reading: a JSON value as null (JSON null), Boolean, Long, Double, String, Map;
  // ---- NO_FAST_PATH for a value the exact validation must see.

  private static final Object NO_FAST_PATH = new Object();
  private static final Object JSON_NULL = new Object();

  private static Object readObject(JsonParser parser) throws IOException {
    Map<String, Object> members = new HashMap<>();
    JsonToken token;
    while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
      String name = parser.currentName();
      Object value = readValue(parser, parser.nextToken());
      if (value == NO_FAST_PATH) {
        return null;
      }
      members.put(name, value);
    }
    return token == JsonToken.END_OBJECT ? members : null;
  }

  private static Object readValue(JsonParser parser, JsonToken token) throws IOException {
    switch (token) {
      case VALUE_NULL:
        return JSON_NULL;
      case VALUE_TRUE:
        return Boolean.TRUE;
      case VALUE_FALSE:
        return Boolean.FALSE;
      case VALUE_STRING:
        String text = parser.getText();
        for (int i = 0; i < text.length(); i++) {
          if (Character.isSurrogate(text.charAt(i))) {
            return NO_FAST_PATH;
          }
        }
        return text;
      case VALUE_NUMBER_INT:
        JsonParser.NumberType type = parser.getNumberType();
        if (type != JsonParser.NumberType.INT && type != JsonParser.NumberType.LONG) {
          return NO_FAST_PATH;
        }
        return parser.getLongValue();
      case VALUE_NUMBER_FLOAT:
        double value = parser.getDoubleValue();
        String number = parser.getText();
        if (!Double.isFinite(value) || digits(number) > MAX_DIGITS) {
          return NO_FAST_PATH;
        }
        // A zero without an exponent is a decimal zero to the exact validation: unsigned.
        return value == 0.0 && number.indexOf('e') < 0 && number.indexOf('E') < 0 ? 0.0 : value;
      case START_OBJECT:
        Object members = readObject(parser);
        return members == null ? NO_FAST_PATH : members;
      default:
        return NO_FAST_PATH;
    }
  }

  /** Whether JSON null is a valid value of a declared property (not of an undeclared one). */
  private static boolean nullable(Node node) {
    return node != null && node.types.contains("null");
  }

  private static int digits(String number) {
    int count = 0;
    for (int i = 0; i < number.length(); i++) {
      char c = number.charAt(i);
      if (c == 'e' || c == 'E') {
        break;
      }
      if (c >= '0' && c <= '9') {
        count++;
      }
    }
    return count;
  }

  private static String kindOf(Object value) {
    if (value == JSON_NULL) {
      return "null";
    }
    if (value instanceof String) {
      return "string";
    }
    if (value instanceof Long) {
      return "integer";
    }
    if (value instanceof Double) {
      return "number";
    }
    if (value instanceof Boolean) {
      return "boolean";
    }
    return "object";
  }

  // ---- the contract

  /** A property's schema: its JSON types and value rules; an object's properties. */
  private static final class Node {
    final Set<String> types = new HashSet<>();
    boolean dateTime;
    int minLength = -1;
    int maxLength = -1;
    Set<String> oneOf;
    boolean nullInOneOf;
    Pattern pattern;
    Double minimum;
    Double maximum;
    Double exclusiveMinimum;
    Double exclusiveMaximum;
    final Map<String, Node> properties = new HashMap<>();
    final Set<String> required = new HashSet<>();
    // An object's column names, in order; a leaf's column type.
    final List<String> columns = new ArrayList<>();
    String column;

    Row row(Map<String, Object> members) {
      Object[] values = new Object[columns.size()];
      for (int i = 0; i < values.length; i++) {
        String name = columns.get(i);
        values[i] = properties.get(name).typed(members.get(name));
      }
      return RowFactory.create(values);
    }

    /** The value of this column: null unless the JSON type stands for the column's. */
    @SuppressWarnings("unchecked")
    Object typed(Object value) {
      if (value == null || value == JSON_NULL) {
        return null;
      }
      switch (column) {
        case "object":
          return value instanceof Map ? row((Map<String, Object>) value) : null;
        case "text":
          return value instanceof String || value instanceof Long ? value.toString() : null;
        case "double":
          return value instanceof Long || value instanceof Double
              ? ((Number) value).doubleValue()
              : null;
        case "long":
          return value instanceof Long ? value : null;
        case "boolean":
          return value instanceof Boolean ? value : null;
        default:
          return value instanceof String ? value : null;
      }
    }

    boolean objectHolds(Map<String, Object> members) {
      for (String name : required) {
        Object value = members.get(name);
        if (value == null || (value == JSON_NULL && !nullable(properties.get(name)))) {
          return false;
        }
      }
      for (Map.Entry<String, Object> member : members.entrySet()) {
        Node node = properties.get(member.getKey());
        if (node == null || !node.holds(member.getValue())) {
          return false;
        }
      }
      return true;
    }

    @SuppressWarnings("unchecked")
    boolean holds(Object value) {
      String kind = kindOf(value);
      if (!types.isEmpty()) {
        boolean allowed =
            types.contains(kind) || (kind.equals("integer") && types.contains("number"));
        if (!allowed) {
          return false;
        }
      }
      if (oneOf != null) {
        boolean listed = value == JSON_NULL ? nullInOneOf : oneOf.contains(value);
        if (!listed) {
          return false;
        }
      }
      if (value instanceof String) {
        String text = (String) value;
        if (dateTime && !ISO_TIMESTAMP.matcher(text).find()) {
          return false;
        }
        if (minLength >= 0 || maxLength >= 0) {
          int length = text.codePointCount(0, text.length());
          if ((minLength >= 0 && length < minLength) || (maxLength >= 0 && length > maxLength)) {
            return false;
          }
        }
        return pattern == null || pattern.matcher(text).find();
      }
      if (value instanceof Long && dateTime) {
        long millis = (Long) value;
        return millis >= MIN_EPOCH_MILLIS && millis <= MAX_EPOCH_MILLIS;
      }
      if (value instanceof Long || value instanceof Double) {
        if (dateTime) {
          return false;
        }
        double number = ((Number) value).doubleValue();
        return (minimum == null || number >= minimum)
            && (maximum == null || number <= maximum)
            && (exclusiveMinimum == null || number > exclusiveMinimum)
            && (exclusiveMaximum == null || number < exclusiveMaximum);
      }
      if (value instanceof Map) {
        return objectHolds((Map<String, Object>) value);
      }
      return true;
    }
  }

  /** An ``if``/``then``/``else``: where its fields are present and equal, then; else, else. */
  private static final class Conditional {
    final List<String> required = new ArrayList<>();
    final Map<String, Set<String>> equals = new HashMap<>();
    final Set<String> nullEquals = new HashSet<>();
    Branch then;
    Branch otherwise;
  }

  private static final class Branch {
    final List<String> required = new ArrayList<>();
    final Map<String, Node> properties = new HashMap<>();
  }

  private transient List<Conditional> conditionals;

  private boolean conditionalsHold(Map<String, Object> members) {
    for (Conditional conditional : conditionals) {
      boolean when = true;
      for (String name : conditional.required) {
        when &= members.containsKey(name);
      }
      for (Map.Entry<String, Set<String>> equal : conditional.equals.entrySet()) {
        Object value = members.get(equal.getKey());
        boolean matches =
            value != null
                && ((value == JSON_NULL && conditional.nullEquals.contains(equal.getKey()))
                    || equal.getValue().contains(value));
        when &= matches;
      }
      Branch branch = when ? conditional.then : conditional.otherwise;
      if (branch != null && !branchHolds(branch, members)) {
        return false;
      }
    }
    return true;
  }

  private boolean branchHolds(Branch branch, Map<String, Object> members) {
    for (String name : branch.required) {
      Object value = members.get(name);
      if (value == null || (value == JSON_NULL && !nullable(root.properties.get(name)))) {
        return false;
      }
    }
    for (Map.Entry<String, Node> property : branch.properties.entrySet()) {
      Object value = members.get(property.getKey());
      if (value != null && !property.getValue().holds(value)) {
        return false;
      }
    }
    return true;
  }

  private Node parseSpec(String text) {
    try {
      JsonNode tree = new ObjectMapper().readTree(text);
      conditionals = new ArrayList<>();
      for (JsonNode c : tree.get("conditionals")) {
        Conditional conditional = new Conditional();
        c.get("required").forEach(n -> conditional.required.add(n.asText()));
        c.get("equals")
            .fields()
            .forEachRemaining(
                e -> {
                  Set<String> values = new HashSet<>();
                  for (JsonNode v : e.getValue()) {
                    if (v.isNull()) {
                      conditional.nullEquals.add(e.getKey());
                    } else {
                      values.add(v.asText());
                    }
                  }
                  conditional.equals.put(e.getKey(), values);
                });
        conditional.then = branch(c.get("then"));
        conditional.otherwise = branch(c.get("otherwise"));
        conditionals.add(conditional);
      }
      return node(tree.get("root"));
    } catch (IOException e) {
      throw new IllegalArgumentException("not a fast-path spec: " + e.getMessage(), e);
    }
  }

  private static Branch branch(JsonNode spec) {
    if (spec == null || spec.isNull()) {
      return null;
    }
    Branch branch = new Branch();
    spec.get("required").forEach(n -> branch.required.add(n.asText()));
    spec.get("properties")
        .fields()
        .forEachRemaining(e -> branch.properties.put(e.getKey(), node(e.getValue())));
    return branch;
  }

  private static Node node(JsonNode spec) {
    Node node = new Node();
    spec.path("types").forEach(n -> node.types.add(n.asText()));
    node.column = spec.path("column").asText("string");
    spec.path("columns").forEach(n -> node.columns.add(n.asText()));
    node.dateTime = spec.path("date_time").asBoolean(false);
    node.minLength = spec.path("minLength").asInt(-1);
    node.maxLength = spec.path("maxLength").asInt(-1);
    if (spec.has("one_of")) {
      node.oneOf = new HashSet<>();
      for (JsonNode v : spec.get("one_of")) {
        if (v.isNull()) {
          node.nullInOneOf = true;
        } else {
          node.oneOf.add(v.asText());
        }
      }
    }
    if (spec.hasNonNull("pattern")) {
      node.pattern = Pattern.compile(spec.get("pattern").asText());
    }
    node.minimum = number(spec, "minimum");
    node.maximum = number(spec, "maximum");
    node.exclusiveMinimum = number(spec, "exclusiveMinimum");
    node.exclusiveMaximum = number(spec, "exclusiveMaximum");
    spec.path("required").forEach(n -> node.required.add(n.asText()));
    spec.path("properties")
        .fields()
        .forEachRemaining(e -> node.properties.put(e.getKey(), node(e.getValue())));
    return node;
  }

  private static Double number(JsonNode spec, String keyword) {
    return spec.hasNonNull(keyword) ? spec.get(keyword).asDouble() : null;
  }
}
