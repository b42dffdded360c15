package lakehouse.ingest;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.time.DateTimeException;
import java.time.LocalDate;
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
 * surrogate, every date-time an instant and every date a day within years 1-9999. Null
 * sends the record to the exact validation, which decides it. The record's columns are the
 * spec's, in its order; a date-time's is its instant in microseconds since the epoch, read
 * as Spark reads an ISO-8601 string (the fraction truncated to microseconds, no zone: UTC)
 * or as epoch milliseconds; a date's is its day since the epoch. A date's bounds depend on
 * the time: Spark checks them.
 *
 * <p>An object's members are read into an array of its declared properties' slots: a key
 * that names none, or one already read (a duplicate), ends the fast path.
 */
public final class FastCheck implements UDF1<String, Row> {
  private static final long serialVersionUID = 1L;
  private static final JsonFactory JSON = new JsonFactory();
  private static final long MIN_EPOCH_MILLIS = -62_135_596_800_000L;
  private static final long MAX_EPOCH_MILLIS = 253_402_300_799_999L;
  private static final long MIN_MICROS = MIN_EPOCH_MILLIS * 1000;
  private static final long MAX_MICROS = MAX_EPOCH_MILLIS * 1000 + 999;
  private static final long NO_INSTANT = Long.MIN_VALUE;
  private static final long NO_DAY = Long.MIN_VALUE;
  private static final int MAX_DIGITS = 15;

  // JSON types, as bits of a node's declared types.
  private static final int NULL = 1;
  private static final int STRING = 2;
  private static final int INTEGER = 4;
  private static final int NUMBER = 8;
  private static final int BOOLEAN = 16;
  private static final int OBJECT = 32;
  private static final Map<String, Integer> TYPES =
      Map.of(
          "null", NULL,
          "string", STRING,
          "integer", INTEGER,
          "number", NUMBER,
          "boolean", BOOLEAN,
          "object", OBJECT);

  // A leaf's column: how its JSON value becomes the record's typed value.
  private enum Column {
    STRING,
    LONG,
    DOUBLE,
    BOOLEAN,
    MICROS,
    DAYS,
    OBJECT
  }

  private final String spec;
  private transient Node root;
  private transient List<Conditional> conditionals;

  /** A checker of the contract {@code spec} (JSON, written by fast_path.py). */
  public FastCheck(String spec) {
    this.spec = spec;
    parseSpec(spec);
  }

  @Override
  public Row call(String payload) {
    if (payload == null) {
      return null;
    }
    if (root == null) {
      parseSpec(spec);
    }
    Object[] members;
    try (JsonParser parser = JSON.createParser(payload)) {
      if (parser.nextToken() != JsonToken.START_OBJECT) {
        return null;
      }
      members = readObject(parser, root);
      if (members == null || parser.nextToken() != null) {
        return null;
      }
    } catch (IOException | RuntimeException e) {
      return null;
    }
    return root.objectHolds(members) && conditionalsHold(members) ? root.row(members) : null;
  }

  // ---- reading: a JSON value as JSON_NULL, Boolean, Long, Double, String, or an object's
  // ---- slots (Object[], null where absent); NO_FAST_PATH for one the exact validation must see.

  private static final Object NO_FAST_PATH = new Object();
  private static final Object JSON_NULL = new Object();

  private static Object[] readObject(JsonParser parser, Node node) throws IOException {
    Object[] members = new Object[node.slots.length];
    JsonToken token;
    while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
      Integer slot = node.index.get(parser.currentName());
      if (slot == null || members[slot] != null) {
        return null;
      }
      Object value = readValue(parser, parser.nextToken(), node.slots[slot]);
      if (value == NO_FAST_PATH) {
        return null;
      }
      members[slot] = value;
    }
    return token == JsonToken.END_OBJECT ? members : null;
  }

  private static Object readValue(JsonParser parser, JsonToken token, Node node)
      throws IOException {
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
        // Only a declared object's members have slots.
        if (node.column != Column.OBJECT) {
          return NO_FAST_PATH;
        }
        Object[] members = readObject(parser, node);
        return members == null ? NO_FAST_PATH : members;
      default:
        return NO_FAST_PATH;
    }
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

  private static int kindOf(Object value) {
    if (value == JSON_NULL) {
      return NULL;
    }
    if (value instanceof String) {
      return STRING;
    }
    if (value instanceof Long) {
      return INTEGER;
    }
    if (value instanceof Double) {
      return NUMBER;
    }
    if (value instanceof Boolean) {
      return BOOLEAN;
    }
    return OBJECT;
  }

  /**
   * The instant of an ISO-8601 date-time, as Spark reads the forms the exact validation
   * accepts ({@code YYYY-MM-DD[T ]hh:mm:ss[.f{1,9}][Z|±hh|±hhmm|±hh:mm]}, no zone: UTC), in
   * microseconds (the fraction truncated); NO_INSTANT for any other text, a day or time that
   * does not exist, an offset beyond ±18:00 or an instant outside years 1-9999.
   */
  static long instantMicros(String text) {
    int n = text.length();
    if (n < 19
        || text.charAt(4) != '-'
        || text.charAt(7) != '-'
        || (text.charAt(10) != 'T' && text.charAt(10) != ' ')
        || text.charAt(13) != ':'
        || text.charAt(16) != ':') {
      return NO_INSTANT;
    }
    int year = number(text, 0, 4);
    int month = number(text, 5, 2);
    int day = number(text, 8, 2);
    int hour = number(text, 11, 2);
    int minute = number(text, 14, 2);
    int second = number(text, 17, 2);
    if (year < 0 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0) {
      return NO_INSTANT;
    }
    int i = 19;
    long nanos = 0;
    if (i < n && text.charAt(i) == '.') {
      int start = ++i;
      while (i < n && i - start < 9 && isDigit(text.charAt(i))) {
        nanos = nanos * 10 + (text.charAt(i++) - '0');
      }
      if (i == start) {
        return NO_INSTANT;
      }
      for (int d = i - start; d < 9; d++) {
        nanos *= 10;
      }
    }
    int offset = 0;
    if (i < n && text.charAt(i) == 'Z') {
      i++;
    } else if (i < n && (text.charAt(i) == '+' || text.charAt(i) == '-')) {
      int sign = text.charAt(i) == '-' ? -1 : 1;
      int hours = number(text, i + 1, 2);
      i += 3;
      int minutes = 0;
      if (i < n) {
        if (text.charAt(i) == ':') {
          i++;
        }
        minutes = number(text, i, 2);
        i += 2;
      }
      if (hours < 0 || minutes < 0 || hours > 18 || minutes > 59 || (hours == 18 && minutes > 0)) {
        return NO_INSTANT;
      }
      offset = sign * (hours * 3600 + minutes * 60);
    }
    if (i != n || hour > 23 || minute > 59 || second > 59) {
      return NO_INSTANT;
    }
    long epochDay;
    try {
      epochDay = LocalDate.of(year, month, day).toEpochDay();
    } catch (DateTimeException e) {
      return NO_INSTANT;
    }
    long seconds = epochDay * 86_400 + hour * 3600 + minute * 60 + second - offset;
    long micros = seconds * 1_000_000 + nanos / 1000;
    return micros >= MIN_MICROS && micros <= MAX_MICROS ? micros : NO_INSTANT;
  }

  /**
   * The day since the epoch of a {@code YYYY-MM-DD} date, as Spark casts it, or NO_DAY for
   * any other text, a day that does not exist or one outside years 1-9999.
   */
  static long epochDay(String text) {
    if (text.length() != 10 || text.charAt(4) != '-' || text.charAt(7) != '-') {
      return NO_DAY;
    }
    int year = number(text, 0, 4);
    int month = number(text, 5, 2);
    int day = number(text, 8, 2);
    if (year < 1 || month < 0 || day < 0) {
      return NO_DAY;
    }
    try {
      return LocalDate.of(year, month, day).toEpochDay();
    } catch (DateTimeException e) {
      return NO_DAY;
    }
  }

  private static boolean isDigit(char c) {
    return c >= '0' && c <= '9';
  }

  /** The {@code length} ASCII digits at {@code at} as a number, or -1. */
  private static int number(String text, int at, int length) {
    if (at + length > text.length()) {
      return -1;
    }
    int value = 0;
    for (int i = at; i < at + length; i++) {
      char c = text.charAt(i);
      if (!isDigit(c)) {
        return -1;
      }
      value = value * 10 + (c - '0');
    }
    return value;
  }

  // ---- the contract

  /** A property's schema: its JSON types and value rules; an object's properties' slots. */
  private static final class Node {
    boolean typed;
    int types;
    boolean dateTime;
    boolean date;
    int minLength = -1;
    int maxLength = -1;
    String[] oneOf;
    boolean nullInOneOf;
    Pattern pattern;
    Double minimum;
    Double maximum;
    Double exclusiveMinimum;
    Double exclusiveMaximum;
    Column column = Column.STRING;
    // An object's properties, in column order: by name, and each one's schema and whether
    // it is required.
    final Map<String, Integer> index = new HashMap<>();
    Node[] slots = new Node[0];
    boolean[] required = new boolean[0];

    boolean nullable() {
      return (types & NULL) != 0;
    }

    Row row(Object[] members) {
      Object[] values = new Object[slots.length];
      for (int i = 0; i < values.length; i++) {
        values[i] = slots[i].typed(members[i]);
      }
      return RowFactory.create(values);
    }

    /** The value of this column: null unless the JSON type stands for the column's. */
    Object typed(Object value) {
      if (value == null || value == JSON_NULL) {
        return null;
      }
      switch (column) {
        case OBJECT:
          return value instanceof Object[] ? row((Object[]) value) : null;
        case DAYS:
          long day = value instanceof String ? epochDay((String) value) : NO_DAY;
          return day == NO_DAY ? null : (int) day;
        case MICROS:
          if (value instanceof Long) {
            return (Long) value * 1000;
          }
          long micros = value instanceof String ? instantMicros((String) value) : NO_INSTANT;
          return micros == NO_INSTANT ? null : micros;
        case DOUBLE:
          return value instanceof Long || value instanceof Double
              ? ((Number) value).doubleValue()
              : null;
        case LONG:
          return value instanceof Long ? value : null;
        case BOOLEAN:
          return value instanceof Boolean ? value : null;
        default:
          return value instanceof String ? value : null;
      }
    }

    boolean objectHolds(Object[] members) {
      for (int i = 0; i < members.length; i++) {
        Object value = members[i];
        if (value == null) {
          if (required[i]) {
            return false;
          }
        } else if ((value == JSON_NULL && required[i] && !slots[i].nullable())
            || !slots[i].holds(value)) {
          return false;
        }
      }
      return true;
    }

    boolean holds(Object value) {
      int kind = kindOf(value);
      if (typed && (types & kind) == 0 && !(kind == INTEGER && (types & NUMBER) != 0)) {
        return false;
      }
      if (oneOf != null && !(value == JSON_NULL ? nullInOneOf : listed(value))) {
        return false;
      }
      if (value instanceof String) {
        String text = (String) value;
        if ((dateTime && instantMicros(text) == NO_INSTANT)
            || (date && epochDay(text) == NO_DAY)) {
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
      if (date && value != JSON_NULL) {
        return false;
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
      if (value instanceof Object[]) {
        // An object's slots are its own property's: a conditional's schema of the same
        // name leaves the record to the exact validation.
        return column == Column.OBJECT && objectHolds((Object[]) value);
      }
      return true;
    }

    private boolean listed(Object value) {
      for (String listed : oneOf) {
        if (listed.equals(value)) {
          return true;
        }
      }
      return false;
    }
  }

  /** An ``if``/``then``/``else``: where its fields are present and equal, then; else, else. */
  private static final class Conditional {
    // Root slots (-1: not a declared property, so never present).
    int[] required;
    int[] equalSlots;
    List<Set<String>> equalValues;
    boolean[] nullEquals;
    Branch then;
    Branch otherwise;
  }

  private static final class Branch {
    int[] required;
    int[] slots;
    Node[] properties;
  }

  private static Object member(Object[] members, int slot) {
    return slot < 0 ? null : members[slot];
  }

  private boolean conditionalsHold(Object[] members) {
    for (Conditional conditional : conditionals) {
      boolean when = true;
      for (int slot : conditional.required) {
        when &= member(members, slot) != null;
      }
      for (int i = 0; i < conditional.equalSlots.length; i++) {
        Object value = member(members, conditional.equalSlots[i]);
        when &=
            value != null
                && ((value == JSON_NULL && conditional.nullEquals[i])
                    || conditional.equalValues.get(i).contains(value));
      }
      Branch branch = when ? conditional.then : conditional.otherwise;
      if (branch != null && !branchHolds(branch, members)) {
        return false;
      }
    }
    return true;
  }

  private boolean branchHolds(Branch branch, Object[] members) {
    for (int slot : branch.required) {
      Object value = member(members, slot);
      if (value == null || (value == JSON_NULL && !root.slots[slot].nullable())) {
        return false;
      }
    }
    for (int i = 0; i < branch.slots.length; i++) {
      Object value = member(members, branch.slots[i]);
      if (value != null && !branch.properties[i].holds(value)) {
        return false;
      }
    }
    return true;
  }

  private void parseSpec(String text) {
    try {
      JsonNode tree = new ObjectMapper().readTree(text);
      Node top = node(tree.get("root"));
      List<Conditional> parsed = new ArrayList<>();
      for (JsonNode c : tree.get("conditionals")) {
        Conditional conditional = new Conditional();
        conditional.required = slots(top, c.get("required"));
        List<String> names = new ArrayList<>();
        c.get("equals").fieldNames().forEachRemaining(names::add);
        conditional.equalSlots = new int[names.size()];
        conditional.nullEquals = new boolean[names.size()];
        conditional.equalValues = new ArrayList<>();
        for (int i = 0; i < names.size(); i++) {
          conditional.equalSlots[i] = top.index.getOrDefault(names.get(i), -1);
          Set<String> values = new HashSet<>();
          for (JsonNode v : c.get("equals").get(names.get(i))) {
            if (v.isNull()) {
              conditional.nullEquals[i] = true;
            } else {
              values.add(v.asText());
            }
          }
          conditional.equalValues.add(values);
        }
        conditional.then = branch(top, c.get("then"));
        conditional.otherwise = branch(top, c.get("otherwise"));
        parsed.add(conditional);
      }
      conditionals = parsed;
      root = top;
    } catch (IOException e) {
      throw new IllegalArgumentException("not a fast-path spec: " + e.getMessage(), e);
    }
  }

  /** The root slots of the names in {@code spec} (-1 for a name no property has). */
  private static int[] slots(Node top, JsonNode spec) {
    int[] slots = new int[spec.size()];
    for (int i = 0; i < slots.length; i++) {
      slots[i] = top.index.getOrDefault(spec.get(i).asText(), -1);
    }
    return slots;
  }

  private static Branch branch(Node top, JsonNode spec) {
    if (spec == null || spec.isNull()) {
      return null;
    }
    Branch branch = new Branch();
    branch.required = slots(top, spec.get("required"));
    List<String> names = new ArrayList<>();
    spec.get("properties").fieldNames().forEachRemaining(names::add);
    branch.slots = new int[names.size()];
    branch.properties = new Node[names.size()];
    for (int i = 0; i < names.size(); i++) {
      branch.slots[i] = top.index.getOrDefault(names.get(i), -1);
      branch.properties[i] = node(spec.get("properties").get(names.get(i)));
    }
    return branch;
  }

  private static Node node(JsonNode spec) {
    Node node = new Node();
    for (JsonNode type : spec.path("types")) {
      node.typed = true;
      node.types |= TYPES.getOrDefault(type.asText(), 0);
    }
    String column = spec.path("column").asText("string");
    node.column = Column.valueOf(column.toUpperCase(java.util.Locale.ROOT));
    node.dateTime = spec.path("date_time").asBoolean(false);
    node.date = spec.path("date").asBoolean(false);
    node.minLength = spec.path("minLength").asInt(-1);
    node.maxLength = spec.path("maxLength").asInt(-1);
    if (spec.has("one_of")) {
      List<String> values = new ArrayList<>();
      for (JsonNode v : spec.get("one_of")) {
        if (v.isNull()) {
          node.nullInOneOf = true;
        } else {
          values.add(v.asText());
        }
      }
      node.oneOf = values.toArray(new String[0]);
    }
    if (spec.hasNonNull("pattern")) {
      node.pattern = Pattern.compile(spec.get("pattern").asText());
    }
    node.minimum = number(spec, "minimum");
    node.maximum = number(spec, "maximum");
    node.exclusiveMinimum = number(spec, "exclusiveMinimum");
    node.exclusiveMaximum = number(spec, "exclusiveMaximum");
    Set<String> required = new HashSet<>();
    spec.path("required").forEach(n -> required.add(n.asText()));
    List<String> columns = new ArrayList<>();
    spec.path("columns").forEach(n -> columns.add(n.asText()));
    node.slots = new Node[columns.size()];
    node.required = new boolean[columns.size()];
    for (int i = 0; i < columns.size(); i++) {
      String name = columns.get(i);
      node.index.put(name, i);
      node.slots[i] = node(spec.get("properties").get(name));
      node.required[i] = required.contains(name);
    }
    return node;
  }

  private static Double number(JsonNode spec, String keyword) {
    return spec.hasNonNull(keyword) ? spec.get(keyword).asDouble() : null;
  }
}
